"""The public API a plugin imports, ``reproci``: the same objects as the code in ``pipeline/``,
light enough for any image, and usable from a project that has a ``pipeline`` package of its own."""

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
    from reproci.adapters.hf import hf_setup as hf
    from reproci.adapters.lightning import lightning_setup as lightning
    from reproci.worker import contract, steppers
    from reproci import EveryEpoch, ModelContext, TrainSetup, hf_setup, lightning_setup

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
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_import_reproci_loads_only_the_worker_side() -> None:
    """``import reproci`` runs in the worker, in any image with python3 and torch: it imports the
    standard library and ``reproci.worker`` alone, never an adapter's library."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    loaded = json.loads(out.stdout)
    assert "reproci" in loaded
    stdlib = set(sys.stdlib_module_names)
    ours = {"pipeline", "reproci", "reference_models"}
    foreign = [m for m in loaded if m.split(".")[0] not in stdlib | ours | {"torch", "numpy"}]
    assert foreign == [], foreign
    assert [m for m in loaded if m.startswith("pipeline.") and not m.startswith("reproci.worker")] == []
    assert not {"transformers", "pytorch_lightning", "lightning"} & set(loaded)


THEIR_PIPELINE = '''"""The user's own data pipeline: a package named like reproci's internal one."""
ROWS = 96
'''

THEIR_PLUGIN = '''"""A user's model, written against the public API only."""
import torch
from torch import nn

from reproci import ModelContext, TrainSetup


def build(ctx: ModelContext) -> TrainSetup:
    model = nn.Linear(8, 1).to(ctx.device)
    x = torch.randn(96, 8, generator=ctx.generator(1))
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True, generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), batch_size=16)
'''


@pytest.mark.slow
@pytest.mark.parametrize("where", [pytest.param((), id="local"),
                                   pytest.param(("--image", IMAGE), id="docker", marks=pytest.mark.docker)])
def test_a_project_with_its_own_pipeline_package_runs_a_plugin_on_the_public_api(
        tmp_path: Path, where: tuple[str, ...], request: pytest.FixtureRequest) -> None:
    """The user's repository root holds a ``pipeline`` package of its own and a plugin that
    imports ``reproci``; the installed command, run from that root, checks the plugin, on the
    host and in a container (where ``reproci`` is mounted beside the worker's code)."""
    if where:
        request.getfixturevalue("engine")  # skips without an engine and the image
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text(THEIR_PIPELINE)
    (tmp_path / "their_plugin.py").write_text(THEIR_PLUGIN)
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "PYTHONPATH")}
    args = ["run", "-m", "their_plugin.py:build", "--steps", "4", "--resume-at", "2", *where]
    out = subprocess.run([str(REPROCI), *args],
                         cwd=tmp_path, env={**env, "CI": "", "COLUMNS": "200"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == errors.EXIT_PASS, out.stdout + out.stderr
    entry = model_entry(json.loads((tmp_path / "results" / "latest.json").read_text()), "their_plugin")
    assert entry["verdict"] == verdicts.NEW, entry
