"""The strict stage on models written with plain torch idioms (``tests/plugins/idioms.py``):
batch types torch's collate keeps, buffers reassigned instead of updated in place, sparse
gradients, samplers of the user's own, a clock-seeded order and an epoch longer than the run.
One real CLI run for all of them (``-j 2``), and a second at ``-j 1`` for the clock."""

from __future__ import annotations

import json

import pytest

from reproci import verdicts

from .helpers import PLUGINS, Cli, model_entry

pytestmark = pytest.mark.slow
IDIOMS = PLUGINS / "idioms.py"
CLEAN = ("namedtuple_batch", "dataclass_batch", "running_stats", "sparse_embedding", "own_batch_sampler_exposed")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, dict]:
    cli = Cli(tmp_path_factory.mktemp("idioms"))
    models = [a for name in (*CLEAN, "clock_order", "long_epoch", "own_batch_sampler") for a in ("-m", f"{IDIOMS}:{name}")]
    out = cli("run", *models, "--steps", "12", "-j", "2")
    assert out.returncode == 1, out.stderr  # clock_order fails
    return cli, cli.latest()


@pytest.mark.parametrize("name", CLEAN)
def test_clean_models_of_common_idioms_are_reproducible(run, name):
    """Before: a namedtuple batch crashed the move to the device, a reassigned buffer read as a
    resume bug, a sparse gradient crashed the fingerprint, a batch sampler with its own generator
    and workers was refused."""
    entry = model_entry(run[1], f"idioms.{name}")
    assert entry["verdict"] == verdicts.NEW, entry["message"]
    assert entry["message"].startswith("A = B = C: bitwise reproducible, resume exact")
    assert "warning" not in entry["message"] and "note" not in entry["message"]


def test_batches_of_every_type_are_checksummed(run):
    cli, doc = run
    for name in ("namedtuple_batch", "dataclass_batch"):
        record = json.loads((cli.cwd / "results" / doc["run_id"] / f"idioms.{name}" / "record-A.json").read_text())
        assert all(record["batch_fingerprints"]) and all(record["batch_contents"]), name
        assert record["batch_opaque"] == []


def test_a_batch_samplers_private_generator_is_named_not_restored(run):
    """A batch sampler of the plugin's own keeps its generator under ``.rng``: a trainer's
    checkpoint holds no such thing, so the harness does not restore it on the plugin's behalf
    either. Resumed in the second epoch, run C draws another order, and the state census names
    the generator; the twin that returns its state from get_extra_state passes (above)."""
    cli, doc = run
    record = json.loads((cli.cwd / "results" / doc["run_id"] / "idioms.own_batch_sampler" / "record-A.json").read_text())
    assert record["loader"]["rngs"] == {"batch_sampler.rng": {"type": "torch.Generator", "snapshotted": False}}
    entry = model_entry(doc, "idioms.own_batch_sampler")
    assert entry["verdict"] == verdicts.RESUME_BROKEN, entry["message"]
    assert ("loader.batch_sampler.rng (torch.Generator) differs between A and C at step "
            f"{entry['resume_at']}") in entry["message"], entry["message"]


def test_a_clock_seeded_order_is_nondeterministic_beside_a_parallel_run(run):
    entry = model_entry(run[1], "idioms.clock_order")
    assert entry["verdict"] == verdicts.NONDETERMINISTIC, entry["message"]
    assert entry["message"].startswith("A ≠ B from step 1")
    assert "different batch: the epoch's samples in another order (data order)" in entry["message"]


def test_a_clock_seeded_order_is_nondeterministic_one_run_at_a_time(tmp_path):
    cli = Cli(tmp_path)
    out = cli("run", "-m", f"{IDIOMS}:clock_order", "--steps", "6", "-j", "1")
    assert out.returncode == 1, out.stderr
    assert model_entry(cli.latest(), "idioms.clock_order")["verdict"] == verdicts.NONDETERMINISTIC


def test_a_run_that_never_leaves_the_first_epoch_says_so(run):
    entry = model_entry(run[1], "idioms.long_epoch")
    assert entry["verdict"] == verdicts.NEW
    assert entry["coverage"] == {"epochs": 1, "batches_per_epoch": 40, "resume_at": 6, "resume_epoch": 0,
                                 "note": entry["coverage"]["note"]}
    assert entry["coverage"]["note"].startswith("the 12 steps never left epoch 0 (the loader has 40 batches an epoch)")
    assert "run --steps 80" in entry["message"]


def test_run_a_moves_k_past_the_first_epoch_when_it_is_not_given(run):
    """4 batches an epoch, 12 steps: k = 6 is in epoch 1 already; at 8 batches an epoch the
    reference transformer's k moves (tests/test_coverage.py covers the rule)."""
    entry = model_entry(run[1], "idioms.running_stats")
    assert entry["coverage"]["resume_at"] == 6 and entry["coverage"]["resume_epoch"] == 1
