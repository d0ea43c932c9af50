"""The worker side may import only the standard library, torch and numpy."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

ALLOWED_THIRD_PARTY = {"torch", "numpy"}
WORKER_SIDE = [ROOT / "reproci" / "worker", ROOT / "reproci" / "reference_models"]
WORKER_MODULES = ("reproci.worker", "reproci.reference_models")  # what the worker side may import of ours


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


# Libraries a worker module may use where they are installed, imported under ``try: ... except ImportError``
# (Triton ships with torch's CUDA builds: the record's kernels on a GPU, the reference arithmetic without it).
OPTIONAL = {ROOT / "reproci" / "worker" / "kernels.py": {"triton"}}


def optional_imports(path: Path) -> set[str]:
    """Roots imported inside a ``try`` whose handler catches ImportError."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError"
                                             for h in node.handlers):
            for stmt in node.body:
                if isinstance(stmt, ast.Import):
                    roots |= {a.name.split(".")[0] for a in stmt.names}
    return roots


def test_worker_side_imports_only_stdlib_torch_numpy():
    stdlib = set(sys.stdlib_module_names)
    for folder in WORKER_SIDE:
        for f in folder.rglob("*.py"):
            optional = OPTIONAL.get(f, set()) & optional_imports(f)
            for root in imported_roots(f):
                if root == "reproci":
                    continue
                assert root in stdlib or root in ALLOWED_THIRD_PARTY | optional, f"{f.relative_to(ROOT)} imports {root}"


ADAPTERS = {"hf.py": {"transformers"}, "lightning.py": {"lightning", "pytorch_lightning"},
            "lightning_fit.py": {"lightning", "pytorch_lightning"}, "__init__.py": set()}


def test_each_adapter_imports_only_the_worker_side_and_its_own_library():
    """The adapters run in the worker, in the image that has the library they adapt, and nothing else of ours."""
    stdlib = set(sys.stdlib_module_names)
    folder = ROOT / "reproci" / "adapters"
    assert {f.name for f in folder.glob("*.py")} == set(ADAPTERS)
    for f in folder.glob("*.py"):
        for root in imported_roots(f) - {"reproci"}:
            assert root in stdlib or root in ALLOWED_THIRD_PARTY | ADAPTERS[f.name], f"{f.name} imports {root}"
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("reproci"):
                assert node.module.startswith("reproci.worker"), f"{f.name} imports {node.module}"


def test_worker_side_never_imports_the_orchestrator():
    for folder in WORKER_SIDE:
        for f in folder.rglob("*.py"):
            tree = ast.parse(f.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("reproci") \
                        and not node.module.startswith(WORKER_MODULES):
                    raise AssertionError(f"{f.relative_to(ROOT)} imports {node.module}")
                depth = len(f.relative_to(folder).parts)  # 1 at the top of the folder, 2 in a subpackage
                if isinstance(node, ast.ImportFrom) and node.level > depth:
                    raise AssertionError(f"{f.relative_to(ROOT)} reaches out of the worker package")


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'click', 'yaml', 'docker', 'rich', 'matplotlib'}:
            raise ImportError('blocked on the worker side: ' + name)
sys.meta_path.insert(0, Block())
import runpy
sys.argv = ['reproci.worker', sys.argv[1]]
runpy.run_module('reproci.worker', run_name='__main__')
"""


@pytest.mark.slow
def test_worker_runs_with_orchestrator_libraries_blocked(tmp_path):
    from reproci.worker.determinism import launch_environment
    from reproci.worker.process.spec import WorkerSpec

    spec = WorkerSpec(model_ref="embedding", model_name="embedding", role="A", steps=3, output="rec.json")
    spec.write(tmp_path / "spec.json")
    env = {**os.environ, **launch_environment(seed=0, threads=1, strict=True), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", BLOCKER, str(tmp_path / "spec.json")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert '"status": "ok"' in (tmp_path / "rec.json").read_text()
