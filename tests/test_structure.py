"""The shape of the code: no import circles, small units, each CLI verb in its own module.

Read with the standard library's ``ast``, so imports inside functions count too (a lazy
import still ties two modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

import click
import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "pipeline"
MAX_MODULE_LINES = 320
MAX_FUNCTION_LINES = 65


def module_name(path: Path) -> str:
    """The import name of a file of pipeline/: the folder installs as the package reproci."""
    parts = ["reproci", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The reproci modules ``name`` imports anywhere in its body (``from . import x`` names
    module x when it is one, else the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if candidate in known:
                    out.add(candidate)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    graph = import_graph()
    # Package __init__ files that only describe their package import nothing; a package
    # importing its own modules would show up here as a circle with them.
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_modules(tmp_path: Path) -> None:
    known = {"reproci.golden.store", "reproci.golden.drift", "reproci.verdicts", "reproci.golden"}
    src = tmp_path / "drift.py"
    src.write_text("from .. import verdicts\nfrom .store import Golden\ndef f():\n    from . import store\n")
    assert imports_of("reproci.golden.drift", src, known) == {"reproci.verdicts", "reproci.golden.store"}


@pytest.mark.parametrize("name,path", sorted(modules().items()))
def test_units_are_small(name: str, path: Path) -> None:
    source = path.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{name} has {source.count(chr(10))} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: {', '.join(long)}"


def test_each_cli_verb_lives_in_its_own_command_module() -> None:
    """From cli.py, a verb's code is one hop away: pipeline/commands/<verb>.py."""
    from reproci.cli import cli

    for name, command in cli.commands.items():
        module = command.callback.__module__ if command.callback else type(command).__module__
        if isinstance(command, click.Group):
            module = next(iter(command.commands.values())).callback.__module__
        assert module == f"reproci.commands.{name.replace('-', '_')}", (name, module)
        source = (PACKAGE / "commands" / f"{name.replace('-', '_')}.py").read_text()
        assert "import click" in source


def test_every_stage_the_options_accept_is_one_entry_of_the_registry() -> None:
    """The orchestrator loops over the registry: a stage --stage accepts and nothing runs is a bug."""
    from reproci.options import STAGES
    from reproci.stages import registry

    assert tuple(s.name for s in registry.STAGES) == STAGES
    assert [s.name for s in registry.selected(("probes", "determinism"))] == ["determinism", "probes"]
    source = (Path(__file__).resolve().parents[1] / "pipeline" / "orchestrate.py").read_text()
    assert not any(f'"{name}" in options.stages' in source for name in STAGES)  # no stage special-cased
