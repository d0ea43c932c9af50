"""Resolving model names and plugin references on the orchestrator side.

Nothing here imports torch or the model code: a reference is checked (the file or
module exists, the form is right, a plugin's source compiles: ``check_syntax``) and
identified by the sha256 of its source, so a change to a model's code is never mistaken
for an upgrade of the image.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from ..reference_models import DESCRIPTIONS, REGISTRY
from ..worker.script import PLACEHOLDERS, placeholders


@dataclass(frozen=True, kw_only=True)
class ScriptModel:
    """A team's own training script run as a model (``--script``): its commands, as given."""

    command: str  # trains from scratch: {steps}, {resume_at}, {out}
    resume: str  # resumes from the checkpoint in {out}
    cwd: Path  # where both run: the directory reproci was started in (or its reproci.yaml's)

    def config(self) -> dict[str, str]:
        """The model's identity beside its file: both commands, as given."""
        return {"script": self.command, "resume_script": self.resume}


@dataclass(frozen=True, kw_only=True)
class ModelRef:
    name: str  # short name used in tables, files and goldens
    ref: str  # what the worker loads: a registry name, FILE.py:factory or module:factory
    source: Path  # the file holding the factory
    plugin: bool
    description: str = ""
    script: ScriptModel | None = None  # a training script run unchanged (--script), not a factory

    @property
    def code_sha256(self) -> str:
        return hashlib.sha256(self.source.read_bytes()).hexdigest()


def check_syntax(path: Path, text: str, shown: str | None = None, factory: str | None = None) -> None:
    """A plugin's source, compiled (never run) with this host's Python before any run: a syntax
    error, or a ``factory`` the file never defines, is one usage error naming the file, not a
    failed run after the launch. Its imports are not followed: the libraries it needs may exist
    only where the runs execute."""
    if path.suffix != ".py":
        return
    try:
        tree = ast.parse(path.read_bytes(), str(path))
        compile(tree, str(path), "exec", dont_inherit=True)  # what only the compiler refuses ('return' outside a function)
    except SyntaxError as e:
        where = f"{shown or path}:{e.lineno}" if e.lineno else str(shown or path)
        version = ".".join(map(str, sys.version_info[:2]))
        raise ModelError(f"{where}: {type(e).__name__}: {e.msg} (the plugin of --model {text}, compiled with Python "
                         f"{version}); fix the file, then run again") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the plugin {path} (from --model {text}): {e}; fix the file") from None
    if factory is not None and not _may_define(tree, factory):
        functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        has = f"its top-level functions: {', '.join(functions)}" if functions else "it defines no top-level function"
        raise ModelError(f"{shown or path} defines no {factory!r} at its top level (from --model {text}; {has}); "
                         "name the factory after the colon")
    kind = _not_callable(tree, factory) if factory is not None else None
    if kind is not None:
        raise ModelError(f"{shown or path}: {factory!r} is {kind}, not a function (from --model {text}); name the "
                         "factory, the function that takes a ModelContext and returns a TrainSetup, after the colon")


_LITERALS = {ast.Constant: "a constant", ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set",
             ast.ListComp: "a list", ast.DictComp: "a dict", ast.SetComp: "a set", ast.JoinedStr: "a string"}


def _not_callable(tree: ast.Module, name: str) -> str | None:
    """What ``name`` is ('3', 'a list') where every binding of it in the module's own scope (under
    an ``if`` or ``try`` too) assigns it a literal: it cannot be called. None where anything else
    may bind it (a def, a class, an import, a loop, any other expression), or where code that can
    bind any name exists (as ``_may_define`` reads it)."""
    scope = _module_scope(tree)
    kinds: list[str] = []
    literal: set[int] = set()  # the Name nodes that a literal assignment binds
    for node in scope:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            named = [t for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                     if isinstance(t, ast.Name) and t.id == name]
            if not named:
                continue
            value = node.value
            kind = repr(value.value) if isinstance(value, ast.Constant) and len(repr(value.value)) <= 30 else \
                next((k for t, k in _LITERALS.items() if isinstance(value, t)), None)
            if kind is None:
                return None
            kinds.append(kind)
            literal.update(id(t) for t in named)
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in (name, "__getattr__") \
                or isinstance(node, ast.Name) and (node.id == name and isinstance(node.ctx, ast.Store) and id(node) not in literal
                                                   or node.id in ("globals", "exec", "setattr", "vars")) \
                or isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    a.name == "*" or (a.asname or a.name.partition(".")[0]) == name for a in node.names):
            return None
    if any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(tree)):
        return None
    return " or ".join(dict.fromkeys(kinds)) or None


def _module_scope(tree: ast.Module) -> list[ast.AST]:
    """Every node of the module's own scope, in the file's order: not the bodies of its functions
    and classes (their decorators are)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(reversed(tree.body))
    while todo:
        node = todo.pop()
        found.append(node)
        inner = node.decorator_list if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
            else list(ast.iter_child_nodes(node))
        todo.extend(reversed(inner))
    return found


def _may_define(tree: ast.Module, name: str) -> bool:
    """Whether a module's code may bind ``name`` at its top level, read from its syntax without
    running it: a def, class, assignment or import of that name outside function and class
    bodies (under an ``if`` or ``try`` too), or a ``global`` of it anywhere. Code that can bind
    any name (``import *``, ``globals()``, ``exec``, ``setattr``, a module ``__getattr__``) may
    define it: the worker then decides."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Global) and name in node.names or \
                isinstance(node, ast.Name) and node.id in ("globals", "exec"):
            return True
    top: list[ast.AST] = list(tree.body)
    while top:
        node = top.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in (name, "__getattr__"):
                return True
            top.extend(node.decorator_list)  # its body runs later, in a scope of its own
            continue
        if isinstance(node, ast.Name) and (node.id == name and isinstance(node.ctx, ast.Store)
                                           or node.id in ("setattr", "vars")):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                a.name == "*" or (a.asname or a.name.partition(".")[0]) == name for a in node.names):
            return True
        top.extend(ast.iter_child_nodes(node))
    return False


def resolve(text: str) -> ModelRef:
    """A registry name, ``path/to/file.py:factory`` or ``package.module:factory``."""
    if text in REGISTRY:
        module, _, _ = REGISTRY[text].partition(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        return ModelRef(name=text, ref=text, source=Path(spec.origin), plugin=False, description=DESCRIPTIONS.get(text, ""))
    target, sep, factory = text.rpartition(":")
    if not sep or not target or not factory or not factory.isidentifier():
        known = ", ".join(REGISTRY)
        raise ModelError(
            f"unknown model {text!r}: use one of {known}, or a plugin as path/to/file.py:factory or module:factory"
        )
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ModelError(f"model file {target} does not exist (from --model {text}); check the path")
        check_syntax(path, text, shown=target, factory=factory)
        return ModelRef(name=f"{path.stem}.{factory}" if factory != "build" else path.stem,
                        ref=f"{path}:{factory}", source=path, plugin=True, description=f"plugin {path.name}:{factory}")
    moved = f"; reproci's reference models are reproci.{target}:{factory} now" \
        if target.partition(".")[0] == "reference_models" else ""
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as e:
        raise ModelError(f"cannot find model module {target!r} (from --model {text}): {e}{moved}; install its "
                         "package, add its folder to PYTHONPATH, or give the file as path/to/file.py:factory") from e
    if spec is None or spec.origin is None:
        raise ModelError(f"cannot find model module {target!r} (from --model {text}){moved}; install its package, "
                         "add its folder to PYTHONPATH, or give the file as path/to/file.py:factory")
    check_syntax(Path(spec.origin), text, factory=factory)
    return ModelRef(name=module_model_name(target, factory), ref=text, source=Path(spec.origin), plugin=True,
                    description=f"plugin {text}")


def module_model_name(module: str, factory: str) -> str:
    """The short name of the model ``module:factory`` (in tables, results and goldens)."""
    last = module.rpartition(".")[2]
    return f"{last}.{factory}" if factory != "build" else last


def resolve_all(texts: tuple[str, ...], more: tuple[ModelRef, ...] = ()) -> tuple[ModelRef, ...]:
    refs = tuple(resolve(t) for t in texts) + more
    seen: dict[str, str] = {}
    for r in refs:
        if not _NAME.fullmatch(r.name) or r.name in (".", ".."):  # it names the model's folder under results/
            raise ModelError(f"model name {r.name!r} (from {r.ref}) cannot name a folder: rename the file or factory "
                             "to letters, digits, '.', '_' and '-'")
        if r.name in seen:
            raise ModelError(f"two models are both named {r.name!r} ({seen[r.name]} and {r.ref}); rename one factory or file")
        seen[r.name] = r.ref
    return refs


_NAME = re.compile(r"\w[\w.-]*")  # a folder name on every system: no separator, no leading dot or dash
_PROGRAMS = ("python", "torchrun", "accelerate", "env")  # not the script: what runs it


def resolve_script(command: str, resume: str | None, name: str | None, cwd: Path, *, said: str = "--script",
                   said_resume: str = "--resume-script") -> ModelRef:
    """The model of ``--script COMMAND --resume-script COMMAND [--name NAME]``, checked before
    any run: each command's placeholders are known ones and name {out}, the file it runs exists
    (its sha256 is the model's code identity), and the name is a safe folder name."""
    if resume is None:
        raise ModelError(f"{said} needs {said_resume}: the command that resumes from the checkpoint the script "
                         "wrote in {out} (e.g. \"python train.py --out_dir {out} --init_from resume\")")
    for flag, text in ((said, command), (said_resume, resume)):
        try:
            fields = placeholders(text)
            words = shlex.split(text)
        except ValueError as e:
            raise ModelError(f"{flag} {text!r} cannot be read: {e}; write a literal brace as {{{{ or }}}}") from None
        unknown = [f for f in fields if f not in PLACEHOLDERS]
        if unknown:
            raise ModelError(f"{flag}: unknown placeholder {{{unknown[0]}}}; the placeholders are "
                             f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if "out" not in fields:
            raise ModelError(f"{flag} has no {{out}}: pass it where the script writes its checkpoints (its output "
                             "folder), so that each run writes its own and run C resumes from a copy of run A's")
        if not words:
            raise ModelError(f"{flag} is empty: give the command that runs your training script")
    source = _script_source(shlex.split(command), cwd, said)
    name = name or source.stem
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ModelError(f"model name {name!r} cannot name a folder: use letters, digits, '.', '_' and '-' (--name)")
    return ModelRef(name=name, ref=command, source=source, plugin=True, description=f"script {source.name}",
                    script=ScriptModel(command=command, resume=resume, cwd=cwd))


def _script_source(words: list[str], cwd: Path, said: str) -> Path:
    """The file a command runs: its first ``*.py`` word, else the module after ``-m``, else the
    program itself where it is not an interpreter or a launcher."""
    words = [w for w in words if "=" not in w or w.startswith("-")]  # NAME=value assignments are not the program
    for i, w in enumerate(words):
        if w.endswith(".py") and "{" not in w:
            path = (cwd / w).resolve()
            if not path.is_file():
                raise ModelError(f"{said}: the script {w} does not exist (from {cwd}); check the path")
            return path
        if w == "-m" and i + 1 < len(words):
            spec = importlib.util.find_spec(words[i + 1]) if "{" not in words[i + 1] else None
            if spec is None or spec.origin is None:
                raise ModelError(f"{said}: cannot find the module {words[i + 1]!r}; install its package or give the file")
            return Path(spec.origin)
    program = words[0] if words else ""
    found = shutil.which(program) if not any(program.startswith(p) for p in _PROGRAMS) else None
    if found is None:
        raise ModelError(f"{said}: cannot tell which script the command runs; name it as FILE.py or -m MODULE")
    return Path(found).resolve()
