"""The shape of the code: no import circles, units within their budget, each CLI verb in its own module.

Read with the standard library's ``ast``, so imports inside functions count too (a lazy
import still ties two modules together)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import click
import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "reproci"
# One concept a module, as big as the concept: no cap to cut a module to. A module past this size
# says why in OVER_BUDGET (the concept that makes it that big), and may grow to twice it, no further.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 65  # a function's, unless FUNCTIONS_OVER_BUDGET gives its reason
CEILING = 2  # a unit with a reason may grow to twice the budget, no further: past that, split it
OVER_BUDGET: dict[str, str] = {}
FUNCTIONS_OVER_BUDGET: dict[str, str] = {}


def module_name(path: Path) -> str:
    """The import name of a file of reproci/: the folder installs as the package reproci."""
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
    out.update(dynamic_imports(name, path, known))
    out.discard(name)
    return out


def dynamic_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The reproci modules a module imports by name at run time (``importlib.import_module``,
    ``__import__``): every string in it that names a module of reproci, where it calls either."""
    source = path.read_text()
    if "import_module(" not in source and "__import__(" not in source:
        return set()
    return {n.value for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in known and n.value != name}


@functools.cache  # read once for the tests that check it (none changes it)
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


def test_an_import_by_name_is_an_edge(tmp_path: Path) -> None:
    """A module imported with importlib (or ``__import__``) ties the two modules as an import does."""
    known = {"reproci.settings.declared", "reproci.stages.registry"}
    src = tmp_path / "declared.py"
    src.write_text("import importlib\ndef f():\n    importlib.import_module('reproci.stages.registry')\n")
    assert imports_of("reproci.settings.declared", src, known) == {"reproci.stages.registry"}
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


# The floors, lowest first: a module may import its own floor and those below. From the top: the
# command line composes the stages and hands them down (Face); the orchestrator loops over them;
# the stages and the engines beyond one machine; the documents they show in (reports, goldens);
# the options and the interface every stage implements; one worker run, local or in a container;
# the results document and the verdicts' figures; the shared utilities; the worker, which runs
# inside the image with the standard library, torch and numpy alone.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("reproci", "reproci.worker", "reproci.adapters", "reproci.reference_models"),
    ("reproci.errors", "reproci.atomic", "reproci.safe_yaml", "reproci.console", "reproci.cpu_flags"),
    ("reproci.results", "reproci.document", "reproci.entry_sections", "reproci.stats", "reproci.typed",
     "reproci.cluster.merged"),
    ("reproci.runner", "reproci.backends", "reproci.images"),
    ("reproci.settings", "reproci.stages.base", "reproci.verdicts", "reproci.golden.folder",
     "reproci.golden.comparison"),
    ("reproci.golden", "reproci.reports"),
    ("reproci.stages", "reproci.cluster"),
    ("reproci.orchestrate",),
    ("reproci.cli", "reproci.commands", "reproci.plugins", "reproci.scaffold"),
)
# The imports from a floor to one above it, each with its reason (at most two).
UPWARD = {
    ("reproci.stages.bisect.command", "reproci.commands.run"): "a stage's verb runs the matrix as `reproci run` does",
    ("reproci.stages.blame.command", "reproci.commands.run"): "a stage's verb runs the matrix as `reproci run` does",
}


def floor(module: str) -> int:
    """The floor of a module: that of the longest prefix the table names."""
    found = [(len(prefix), i) for i, names in enumerate(LAYERS) for prefix in names
             if module == prefix or module.startswith(prefix + ".")]
    assert found, f"{module} is on no floor: add it to LAYERS (tests/test_structure.py)"
    return max(found)[1]


def test_no_import_runs_up_a_floor_but_two_with_their_reasons() -> None:
    graph = import_graph()
    upward = {(a, b) for a, imported in graph.items() for b in imported if floor(b) > floor(a)}
    assert upward == set(UPWARD), sorted(upward)
    assert len(UPWARD) <= 2


def test_no_module_outside_a_stage_names_it() -> None:
    """A stage's name is said in its own package alone: as a string, or as an import of its
    package. The composition (reproci/plugins.py) lists this package's stages; a stage's package
    may name the stages it starts from (``needs``: bisect and blame explain the determinism
    stage's verdicts)."""
    from reproci import plugins

    stages = plugins.stages()
    needs = {s.name: set(s.needs) for s in stages}
    found = []
    for name, path in modules().items():
        if name == "reproci.plugins":
            continue
        own = name.split(".")[2] if name.startswith("reproci.stages.") and path.parent.name != "stages" else None
        allowed = {own, *needs.get(own or "", ())}
        imported = {m.split(".")[2] for m in import_graph()[name] if m.startswith("reproci.stages.")}
        said = {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}
        found += [f"{name}: {stage}" for stage in stages.names() if stage not in allowed and (stage in said or stage in imported)]
    assert found == []


def test_relative_imports_resolve_to_modules(tmp_path: Path) -> None:
    known = {"reproci.golden.store", "reproci.golden.drift", "reproci.verdicts", "reproci.golden"}
    src = tmp_path / "drift.py"
    src.write_text("from .. import verdicts\nfrom .store import Golden\ndef f():\n    from . import store\n")
    assert imports_of("reproci.golden.drift", src, known) == {"reproci.verdicts", "reproci.golden.store"}


def over_budget(name: str, size: int, budget: int, reasons: dict[str, str], table: str) -> str | None:
    """Why a unit of ``size`` lines breaks its budget, or None: over the budget without a reason in
    ``reasons``, or over the ceiling with one."""
    if name in reasons:
        if size > budget * CEILING:
            return (f"{name} has {size} lines, over the ceiling of {budget * CEILING} even with its reason "
                    f"({reasons[name]}): split it")
        return None
    if size > budget:
        return (f"{name} has {size} lines, over the budget of {budget}: split it along its concepts, or give "
                f"the concept that makes it this size in {table} (tests/test_structure.py)")
    return None


def functions(name: str, source: str) -> list[tuple[str, int]]:
    """Each function's dotted name (a method's or a nested function's without its class) and size."""
    return [(f"{name}.{node.name}", node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None]


@pytest.mark.parametrize("name,path", sorted(modules().items()))
def test_units_are_within_their_budget(name: str, path: Path) -> None:
    source = path.read_text()
    problems = [over_budget(name, source.count("\n"), MAX_MODULE_LINES, OVER_BUDGET, "OVER_BUDGET")]
    problems += [over_budget(f, size, MAX_FUNCTION_LINES, FUNCTIONS_OVER_BUDGET, "FUNCTIONS_OVER_BUDGET")
                 for f, size in functions(name, source)]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_every_reason_names_a_unit_over_its_budget() -> None:
    """A reason outlives its unit's size: once a module or function is back within budget (or gone), its
    line goes, so the tables list exactly what is big today."""
    sizes = {name: path.read_text().count("\n") for name, path in modules().items()}
    stale = [name for name in OVER_BUDGET if sizes.get(name, 0) <= MAX_MODULE_LINES]
    biggest: dict[str, int] = {}
    for name, path in modules().items():
        for f, size in functions(name, path.read_text()):
            biggest[f] = max(size, biggest.get(f, 0))
    stale += [name for name in FUNCTIONS_OVER_BUDGET if biggest.get(name, 0) <= MAX_FUNCTION_LINES]
    assert not stale, f"within budget or gone, remove their reasons: {', '.join(stale)}"


def test_the_budget_names_what_to_do() -> None:
    reasons = {"reproci.big": "its concept"}
    assert over_budget("reproci.small", 600, 600, reasons, "OVER_BUDGET") is None
    assert "split it along its concepts" in over_budget("reproci.small", 601, 600, reasons, "OVER_BUDGET")
    assert over_budget("reproci.big", 1200, 600, reasons, "OVER_BUDGET") is None
    assert "over the ceiling of 1200 even with its reason" in over_budget("reproci.big", 1201, 600, reasons, "OVER_BUDGET")


STAGE_COMMAND_MODULE = "command"  # a stage's verbs: reproci/stages/<stage>/command.py


def test_each_cli_verb_lives_in_its_own_command_module() -> None:
    """From cli.py, a verb's code is one hop away: a core verb's in reproci/commands/<verb>.py, a
    stage's own (``Stage.commands``) in reproci/stages/<stage>/command.py, which its stage lists."""
    from reproci import plugins
    from reproci.cli import cli

    owners = {command.name: stage.name for stage in plugins.stages() for command in stage.commands}
    assert {"audit", "bisect", "blame", "compare"} <= set(owners)
    for name, command in cli.commands.items():
        module = command.callback.__module__ if command.callback else type(command).__module__
        if isinstance(command, click.Group):
            module = next(iter(command.commands.values())).callback.__module__
        if name in owners:
            assert module == f"reproci.stages.{owners[name]}.{STAGE_COMMAND_MODULE}", (name, module)
            source = (PACKAGE / "stages" / owners[name] / f"{STAGE_COMMAND_MODULE}.py").read_text()
        else:
            assert module == f"reproci.commands.{name.replace('-', '_')}", (name, module)
            source = (PACKAGE / "commands" / f"{name.replace('-', '_')}.py").read_text()
        assert "import click" in source or "run_command" in source, name
    assert list(cli.list_commands(click.Context(cli))) == sorted(cli.commands)  # `reproci --help`: by name


# The layers that loop over the stages they are handed (``stages.base.Stage``'s hooks) and import no stage.
STAGE_FREE = ("reproci.reports.", "reproci.golden.", "reproci.cluster.", "reproci.verdicts")


def test_each_stage_renders_its_own_parts_and_the_reports_hold_no_stage_rendering() -> None:
    """A stage's parts of every channel (its tables and sections, golden summary and lines, exit
    code, PR body, annotations, webhook lines, history and trends, export, matrix columns) are its
    own, in its package: no module of reproci/reports/, golden/ or cluster/, nor the verdicts,
    imports a stage's package; they read the interface alone (``reproci.stages.base``)."""
    graph = import_graph()
    for name, imported in graph.items():
        if name.startswith(STAGE_FREE):
            stages = {m for m in imported if m.startswith("reproci.stages.") and m != "reproci.stages.base"}
            assert stages == set(), name


def test_every_stage_the_options_accept_is_one_stage_of_the_composition() -> None:
    """The orchestrator loops over the composed stages: a stage --stage accepts and nothing runs is a bug."""
    from reproci import plugins

    stages = plugins.stages()
    assert plugins.catalog().names == stages.names()
    assert [s.name for s in stages.selected(("probes", "determinism"))] == ["determinism", "probes"]
    for path in (PACKAGE / "orchestrate.py", PACKAGE / "commands" / "run.py", *sorted((PACKAGE / "reports").glob("*.py"))):
        source = path.read_text()
        for name in stages.names():  # no stage special-cased: each says its own part
            assert not re.search(rf'"{name}"\s+(not\s+)?in\s+[^\n]*stages', source), (path.name, name)


def test_the_options_and_the_commands_name_no_stage() -> None:
    """What an option or a stage needs of the others is data the stage declares (``needs``,
    ``needs_image``, ``in_golden_update``, an option's ``adds_stage`` and ``needs_stage``, the stage that
    checks reproducibility as ``declared.CHECKER``): the options, the command line and the core
    commands name no stage."""
    from reproci import plugins

    names = set(plugins.stages().names())
    for path in (PACKAGE / "settings" / "options.py", PACKAGE / "settings" / "declared.py", PACKAGE / "cli.py",
                 *sorted((PACKAGE / "commands").glob("*.py"))):
        named = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and n.value in names]
        assert named == [], path.name
