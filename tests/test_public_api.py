"""The public API a plugin imports, ``reproci`` (the source folder ``reproci/``):
the same objects as the worker uses, light enough for any image, usable from a project that has a
``pipeline`` package of its own; and the old ``pipeline.*`` imports, deprecated aliases for one release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reproci import errors, verdicts

from .helpers import ROOT, installed, model_entry
from .test_docker_integration import IMAGE, engine  # noqa: F401 - the fixture, for the run in a container

REPROCI = Path(sys.executable).with_name("reproci")  # the console script an install puts on PATH


def test_the_public_names_are_the_objects_the_worker_uses() -> None:
    installed("transformers", "pytorch_lightning")
    import reproci
    from reproci import EveryEpoch, ModelContext, TrainSetup, hf_setup, lightning_setup
    from reproci.adapters.hf import hf_setup as hf
    from reproci.adapters.lightning import lightning_setup as lightning
    from reproci.worker import contract, steppers

    assert (ModelContext, TrainSetup, EveryEpoch) == (contract.ModelContext, contract.TrainSetup, steppers.EveryEpoch)
    assert hf_setup is hf and lightning_setup is lightning
    assert set(reproci.__all__) <= set(dir(reproci)) and (ROOT / "reproci" / "py.typed").is_file()
    with pytest.raises(ImportError, match="cannot import name 'nothing_here'"):
        from reproci import nothing_here  # noqa: F401


PROBE = """
import json, sys
import numpy, torch
before = set(sys.modules)
import reproci
reproci.ModelContext, reproci.TrainSetup, reproci.EveryEpoch
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_import_reproci_loads_only_the_worker_side() -> None:
    """``import reproci`` and its contract run in the worker, in any image with python3 and torch:
    they import the standard library and ``reproci.worker`` alone, never an adapter's library."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert {"reproci", "reproci.worker.contract", "reproci.worker.steppers"} <= set(loaded)
    stdlib = set(sys.stdlib_module_names)
    ours = {"reproci"}
    foreign = [m for m in loaded if m.split(".")[0] not in stdlib | ours | {"torch", "numpy"}]
    assert foreign == [], foreign
    assert [m for m in loaded if m.startswith("reproci.") and not m.startswith("reproci.worker")] == []
    assert not {"transformers", "pytorch_lightning", "lightning"} & set(loaded)


THEIR_DATA = '''"""The user's own data pipeline: a package named like reproci's source folder."""
import torch


def make_batches(generator: torch.Generator) -> torch.utils.data.TensorDataset:
    x = torch.randn(96, 8, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
'''

THEIR_PLUGIN = '''"""A user's model, written against the public API, with data from the project's own package."""
import torch
from torch import nn

from pipeline.data import make_batches
from reference_models import WIDTH
from reproci import ModelContext, TrainSetup


def build(ctx: ModelContext) -> TrainSetup:
    model = nn.Linear(WIDTH, 1).to(ctx.device)
    loader = torch.utils.data.DataLoader(make_batches(ctx.generator(1)), batch_size=16, shuffle=True,
                                         generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), batch_size=16)
'''

def run_installed(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``reproci`` command, run from ``cwd`` as a user runs it (nothing of the checkout on the path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "PYTHONPATH")}
    return subprocess.run([str(REPROCI), *args], cwd=cwd, env={**env, "CI": "", "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("where", [pytest.param((), id="local"),
                                   pytest.param(("--image", IMAGE), id="docker", marks=pytest.mark.docker)])
def test_a_project_with_its_own_pipeline_and_reference_models_packages_runs_a_plugin_that_imports_them(
        tmp_path: Path, where: tuple[str, ...], request: pytest.FixtureRequest) -> None:
    """The user's repository root holds ``pipeline`` and ``reference_models`` packages of its
    own, and a plugin that imports them and ``reproci``; the installed command, run from that
    root, checks the plugin, on the host and in a container (where reproci is mounted as
    ``reproci``): nothing of reproci's takes a top-level name a user's repository may have."""
    if where:
        request.getfixturevalue("engine")  # skips without an engine and the image
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "data.py").write_text(THEIR_DATA)
    (tmp_path / "reference_models").mkdir()
    (tmp_path / "reference_models" / "__init__.py").write_text('"""The user\'s own models."""\nWIDTH = 8\n')
    (tmp_path / "my_model.py").write_text(THEIR_PLUGIN)
    out = run_installed(tmp_path, "run", "-m", "my_model.py:build", "--steps", "4", "--resume-at", "2", *where)
    assert out.returncode == errors.EXIT_PASS, out.stdout + out.stderr
    entry = model_entry(json.loads((tmp_path / "results" / "latest.json").read_text()), "my_model")
    assert entry["verdict"] == verdicts.NEW, entry


def test_a_pipeline_package_of_ones_own_is_theirs(tmp_path: Path) -> None:
    """reproci imported first (as in the worker), a ``pipeline`` package of the user's own (the name
    reproci's source folder once had) is theirs, with no warning."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "data.py").write_text("ROWS = 96\n")
    code = "import reproci, warnings; warnings.simplefilter('error'); import pipeline.data; print(pipeline.data.ROWS)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout == "96\n", out.stderr
