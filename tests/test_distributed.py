"""``--world-size N``: ranks under DDP launched by torchrun, each rank checked like one
process, replicas compared with each other, a forgotten ``set_epoch`` reported, and world
size part of a run's identity. The slow tests run gloo on the CPU at world size 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path, PurePosixPath

import pytest
import torch

from reproci import errors, plugins, verdicts
from reproci.backends import docker_spec
from reproci.backends.local import LocalBackend
from reproci.cluster import github_matrix
from reproci.golden import drift
from reproci.golden import store as golden
from reproci.plugins import build_options
from reproci.stages.determinism import epochs, replicas
from reproci.worker.contract import ModelContext
from reproci.worker.process.launch import worker_command
from reproci.worker.process.spec import WorkerSpec, for_rank, rank_path
from reproci.worker.run_record import FailedRun

from .helpers import PLUGINS, Cli, left_behind, model_entry, run_record, run_step
from .test_golden import fake_run
from .test_options import cli
from .workflow_helpers import load, step_named, stub_reproci  # noqa: F401 - a fixture

DDP = PLUGINS / "ddp.py"


def test_two_ranks_run_under_torchrun_and_one_runs_alone():
    assert worker_command("python3", "spec-A.json") == ["python3", "-m", "reproci.worker", "spec-A.json"]
    assert worker_command("py", "w/s.json", world_size=2) == [
        "py", "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1", "--nproc-per-node=2",
        "--log-dir=w/torchrun", "-m", "reproci.worker", "w/s.json"]
    spec = WorkerSpec(model_ref="conv", model_name="conv", role="A", steps=4, world_size=4)
    assert docker_spec.worker_command(spec, PurePosixPath("/reproci/run/conv/spec-A.json"))[:6] == [
        "python3", "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1", "--nproc-per-node=4"]


def test_each_rank_writes_its_own_files_and_rank_0_keeps_the_runs_names():
    spec = WorkerSpec(model_ref="conv", model_name="conv", role="C", steps=4, output="record-C.json",
                      resume_from="ckpt-2.pt", checkpoint_path="ckpt-2.pt", final_dump_path="final-A.pt", world_size=2)
    assert for_rank(spec, 0) == spec
    one = for_rank(spec, 1)
    assert (one.output, one.resume_from, one.checkpoint_path) == ("record-C.rank1.json", "ckpt-2.rank1.pt", "ckpt-2.rank1.pt")
    assert one.final_dump_path is None and one.checkpoint_pattern == "ckpt-{step}.rank1.pt"
    assert rank_path("record-A.json", 3) == "record-A.rank3.json"


@pytest.mark.parametrize("kw, fragment", [
    (dict(world_size=0), "--world-size must be at least 1 (got 0)"),
    (dict(world_size=2, device="cuda", image="img:1", gpus="1"), "--gpus 1 gives 1: lower --world-size"),
    (dict(world_size=3, device="cuda", image="img:1", gpus="0,1"), "--gpus 0,1 gives 2"),
])
def test_bad_world_sizes_are_usage_errors(kw, fragment):
    with pytest.raises(errors.UsageError, match="world-size") as e:
        build_options(cli(**kw), env={})
    assert fragment in str(e.value) and e.value.return_code == errors.EXIT_USAGE


def test_world_size_comes_from_the_command_line_or_the_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert build_options(cli(), env={}).world_size == 1
    (tmp_path / "reproci.yaml").write_text("world_size: 2\n")
    o = build_options(cli(), env={})
    assert o.world_size == 2 and o.jobs == max(1, min(3, len(__import__("os").sched_getaffinity(0)) // 2))
    assert build_options(cli(world_size=4, device="cuda", image="img:1", gpus="all"), env={}).world_size == 4


def test_a_factory_written_for_one_process_keeps_working_and_shards_above_one():
    ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=3)
    assert (ctx.rank, ctx.world_size) == (0, 1) and ctx.shuffling([1, 2]) == {"shuffle": True}
    sampler = ModelContext("quick", torch.device("cpu"), 3, rank=1, world_size=2).shuffling(list(range(8)))["sampler"]
    assert isinstance(sampler, torch.utils.data.DistributedSampler) and len(list(sampler)) == 4
    assert (sampler.rank, sampler.num_replicas, sampler.seed, sampler.shuffle) == (1, 2, 3, True)


def test_the_matrix_asks_for_the_manifests_world_size():
    assert github_matrix.entry("gpu-b", {"gpu": True, "world_size": 2}, ("gpu",))["world_size"] == 2
    assert github_matrix.entry("cpu-a", {}, ("gpu",))["world_size"] == 1
    with pytest.raises(errors.ConfigError, match="world_size must be a positive integer"):
        github_matrix.entry("gpu-b", {"world_size": "two"}, ("gpu",))


# -- replicas and epochs, on records as the worker writes them --------------------------------

NAMES = ["param:w", "grad:w", "buffer:bn.running_mean", "optim:w.momentum_buffer"]


def _record(rows, *, broadcast_buffers=True, epochs_=None, batches=None, shuffles=True):
    return run_record(tensor_names=NAMES, fingerprints=rows, start_step=0, final_sha256="f",
                      tensor_sha256={n: "h" for n in NAMES}, losses=[0.5] * len(rows),
                      batch_fingerprints=batches or [1] * len(rows), batch_epochs=epochs_ or [0] * len(rows),
                      initial_fingerprint={"step": 0, "names": NAMES, "row": [1, 0, 0, 0]},
                      distributed={"ddp": {"broadcast_buffers": broadcast_buffers}}, loader={"shuffles": shuffles})


def test_a_rank_whose_buffers_leave_rank_0s_is_named_with_run_step_and_tensor():
    rank0 = _record([[1, 2, 3, 4], [5, 6, 7, 8]], broadcast_buffers=False)
    rank1 = _record([[1, 2, 3, 4], [5, 6, 9, 8]], broadcast_buffers=False)
    rank1.losses, rank1.batch_fingerprints = [0.7, 0.1], [8, 9]  # its own shard: never compared
    records = {"A": rank0, "B": rank0, "C": rank0}
    verdict, pair, div, rank = replicas.decide(records, {1: {"A": rank1, "B": rank1, "C": rank1}},
                                               lambda recs: (verdicts.PASS, None, None))
    assert (verdict, pair, rank, div.step, div.tensor) == (verdicts.REPLICAS_DIVERGE, ("A", "A"), 1, 2,
                                                           "buffer:bn.running_mean")
    message = replicas.describe(verdict, div, pair, rank, rank1)
    assert message.startswith("rank 1's replica ≠ rank 0's in run A from step 2, first at buffer:bn.running_mean")
    assert "broadcast_buffers=False" in message


def test_buffers_that_ddp_broadcasts_before_each_forward_may_differ_at_a_steps_end():
    rank0, rank1 = _record([[1, 2, 3, 4]]), _record([[1, 2, 9, 4]])
    assert replicas.replica_divergence(rank0, rank1) is None
    rank1.fingerprints = [[1, 5, 9, 4]]  # a gradient, though, is reduced: it must agree
    assert replicas.replica_divergence(rank0, rank1).tensor == "grad:w"


def test_a_rank_that_does_not_reproduce_itself_is_named():
    a, b = _record([[1, 2, 3, 4]]), _record([[1, 2, 3, 5]])
    from reproci.stages.determinism import _decide

    verdict, pair, div, rank = replicas.decide({"A": a, "B": a, "C": a}, {1: {"A": a, "B": b, "C": a}}, _decide)
    assert (verdict, pair, rank) == (verdicts.NONDETERMINISTIC, ("A", "B"), 1)
    assert replicas.describe(verdict, div, pair, rank, a).startswith("A ≠ B on rank 1 from step 1")


def test_a_shuffling_loader_that_repeats_its_order_each_epoch_is_reported():
    repeated = _record([[0] * 4] * 6, epochs_=[0, 0, 1, 1, 2, 2], batches=[7, 8, 7, 8, 7, 8])
    assert epochs.repeated_order(repeated).startswith("epoch 2 visits the samples in the same order as epoch 1")
    reshuffled = _record([[0] * 4] * 6, epochs_=[0, 0, 1, 1, 2, 2], batches=[7, 8, 9, 7, 8, 9])
    assert epochs.repeated_order(reshuffled) is None
    assert epochs.repeated_order(dataclasses.replace(repeated, loader={"shuffles": False})) is None  # an ordered loader repeats by design


def test_a_golden_recorded_at_another_world_size_is_env_changed(tmp_path):
    document, records, states = fake_run(0)
    document["environment"]["world_size"] = 4
    golden.write(tmp_path, "img", document, records, states, plugins.stages())
    old = golden.load(tmp_path, "img")
    now, records_now, _ = fake_run(1)
    now["environment"]["world_size"] = 2
    section = drift.compare(now["models"][0], records_now["m"], None, now, old, ci=False, image_name="img")
    assert section.verdict == verdicts.ENV_CHANGED
    assert section.message.endswith("(world size 4 → 2)") and section.env_diff == {"world_size": [4, 2]}


# -- world size 2 on the CPU, gloo ------------------------------------------------------------

def _torchrun_folders() -> set[Path]:
    """What torchrun left in the system's temporary directory (``torchelastic_*``)."""
    import tempfile

    return set(Path(tempfile.gettempdir()).glob("torchelastic_*"))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """One real ``reproci run --world-size 2`` of ``ddp.sharded``, strict stage and its cost:
    its output, results document, run directory, and the torchrun folders it added to the
    system's temporary directory."""
    tmp_path = tmp_path_factory.mktemp("sharded")
    before = _torchrun_folders()
    out = Cli(tmp_path)("run", "-m", f"{DDP}:sharded", "--world-size", "2", "--steps", "6", "--resume-at", "3",
                        "-s", "determinism", "-s", "throughput", "--repetitions", "1")
    added = _torchrun_folders() - before
    assert out.returncode == 0, out.stdout + out.stderr
    doc = Cli(tmp_path).latest()
    return {"out": out, "doc": doc, "work": tmp_path / "results" / doc["run_id"] / "ddp.sharded", "added": added}


@pytest.mark.slow
def test_two_ranks_pass_a_b_and_a_resume_and_the_cost_is_timed_at_two_ranks(sharded):
    out, doc = sharded["out"], sharded["doc"]
    entry = model_entry(doc, "ddp.sharded")
    assert entry["verdict"] == verdicts.NEW and entry["message"].startswith("A = B = C: bitwise reproducible")
    assert entry["world_size"] == 2 and doc["options"]["world_size"] == 2 and doc["environment"]["world_size"] == 2
    assert entry["epoch_order"] is None and entry["shared_batches"] is None and "warning" not in entry["message"]
    work = sharded["work"]
    rank1 = json.loads((work / "record-C.rank1.json").read_text())
    assert rank1["distributed"] == {"rank": 1, "world_size": 2, "backend": "gloo",
                                    "ddp": {"wrapped_by": "harness", "bucket_cap_mb": 25, "broadcast_buffers": True}}
    assert rank1["start_step"] == 3 and rank1["replayed"] == "index"
    # the throughput stage times each mode as a job of two ranks, one mode after the other
    t = entry["throughput"]
    assert t["world_size"] == 2 and t["order"] == "ABBA" and t["error"] is None
    assert t["modes"]["strict"]["steps_per_s"] > 0 and t["slowdown"]["median"] > 0
    timed = json.loads((work / "record-throughput-strict-1.rank1.json").read_text())
    assert timed["distributed"]["world_size"] == 2 and timed["mode"] == "strict"
    assert "each mode a job of 2 ranks under DDP, timed by rank 0" in out.stdout
    from reproci.reports import build

    md = build.markdown_report(doc, plugins.stages())
    assert "· world size 2 ·" in md
    assert "each mode a fresh job of 2 ranks under DDP, timed by rank 0 (one after another, ABBA)" in md


@pytest.mark.slow
def test_ranks_that_all_train_on_the_same_batches_are_a_warning(tmp_path):
    """A plain shuffling loader under --world-size 2 (no DistributedSampler): every rank trains on
    all the data. Each rank reproduces itself, so the verdict stands; the warning says how to shard,
    and reaches the user: a line on stderr beside the NEW notice, and the Warnings of ``reproci report``."""
    cli = Cli(tmp_path)
    out = cli("run", "-m", f"{DDP}:unsharded", "--world-size", "2", "--steps", "6", "--resume-at", "3")
    assert out.returncode == 0, out.stderr
    entry = model_entry(cli.latest(), "ddp.unsharded")
    said = entry["shared_batches"]
    assert entry["verdict"] == verdicts.NEW
    assert said.startswith("rank 0 and rank 1 train on the same batches at every step")
    assert "; warning: " + said in entry["message"]
    assert "ctx.shuffling(dataset)" in said
    assert f"warning: ddp.unsharded: {said}" in " ".join(out.stderr.split())
    report = cli("report", "--format", "md")
    assert report.returncode == 0, report.stderr
    assert f"- ⚠️ **ddp.unsharded**: {said}" in report.stdout.split("### Warnings", 1)[1]


@pytest.mark.slow
def test_replicas_that_part_are_replicas_diverge_exit_1_and_a_sampler_hidden_from_set_epoch_a_warning(tmp_path):
    """A real ``reproci run --world-size 2`` of the twin of ``sharded`` (which passes both checks
    above) with both mistakes: each rank reproduces itself, A = B = C, but with
    ``broadcast_buffers=False`` rank 1's BatchNorm statistics leave rank 0's at step 1. Never a golden."""
    cli = Cli(tmp_path)
    out = cli("run", "-m", f"{DDP}:careless", "--world-size", "2", "--steps", "6", "--resume-at", "3",
              "--update-golden", "--goldens-dir", "g")
    assert out.returncode == errors.EXIT_REPRO_FAILURE, out.stdout + out.stderr
    doc = cli.latest()
    entry = model_entry(doc, "ddp.careless")
    assert entry["verdict"] == verdicts.REPLICAS_DIVERGE and entry["world_size"] == 2, entry["message"]
    assert entry["message"].startswith("rank 1's replica ≠ rank 0's in run A from step 1, first at buffer:1.running_mean")
    assert "broadcast_buffers=False" in entry["message"]
    assert entry["evidence"]["comparison"] == "run A: rank 0 vs rank 1" and entry["evidence"]["rank"] == 1
    assert verdicts.first_difference(entry["evidence"]) == "step 1, buffer:1.running_mean"
    assert entry["epoch_order"].startswith("epoch 2 visits the samples in the same order as epoch 1")
    assert "; warning: " + entry["epoch_order"] in entry["message"]
    assert f"ddp.careless: REPLICAS_DIVERGE: {entry['message']}" in " ".join(out.stdout.split())
    work = tmp_path / "results" / doc["run_id"] / "ddp.careless"
    ranks = {r: json.loads((work / rank_path("record-A.json", r)).read_text()) for r in (0, 1)}
    assert ranks[0]["final_sha256"] != ranks[1]["final_sha256"]
    assert {r["final_sha256"] for r in entry["runs"].values()} == {ranks[0]["final_sha256"]}  # rank 0: A = B = C
    assert ranks[0]["batch_epochs"] == [0, 0, 0, 0, 1, 1] and ranks[0]["loader"]["shuffles"] is True
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())
    assert "golden not updated: ddp.careless is REPLICAS_DIVERGE" in out.stderr


@pytest.mark.slow
def test_a_repeated_order_is_found_in_one_process_too(tmp_path):
    """A DistributedSampler kept at world size 1 inside a batch sampler that drops set_epoch:
    the determinism stage passes and warns, naming the epochs."""
    out = Cli(tmp_path)("run", "-m", f"{DDP}:forgets_the_epoch", "--steps", "10", "--resume-at", "5")
    assert out.returncode == 0, out.stderr
    entry = model_entry(Cli(tmp_path).latest(), "ddp.forgets_the_epoch")
    assert entry["verdict"] == verdicts.NEW and entry["world_size"] == 1
    assert entry["epoch_order"].startswith("epoch 2 visits the samples in the same order as epoch 1 (first 2 "
                                           "batches compared): the shuffle is re-seeded each epoch, or the sampler's")
    assert "; warning: " + entry["epoch_order"] in entry["message"]
    assert "warning: ddp.forgets_the_epoch: epoch 2 visits" in out.stderr.replace("\n", " ")


def test_a_run_whose_rank_1_failed_says_so(tmp_path):
    from reproci.runner import rank_failure

    spec = WorkerSpec(model_ref="m", model_name="m", role="B", steps=4, output="record-B.json", world_size=3)
    assert rank_failure(tmp_path, spec) is None
    failed = FailedRun(error_kind="crash", message="ZeroDivisionError: division by zero", traceback="", model="m",
                       role="B")
    (tmp_path / "record-B.rank2.json").write_text(json.dumps(failed.to_json()))
    found = rank_failure(tmp_path, spec)
    assert found is not None and found[0].message == "rank 2: ZeroDivisionError: division by zero"
    assert found[1] == tmp_path / "record-B.rank2.json"


@pytest.mark.slow
def test_a_stopped_run_leaves_no_rank_behind(tmp_path):
    """torchrun starts each rank in a session of its own: stopping torchrun's process group
    alone (as for one process) would leave them running. Stopped as on Ctrl-C or a timeout,
    once both ranks are in their first step."""
    import threading
    import time

    backend = LocalBackend(build_options(cli(), env={}))
    spec = WorkerSpec(model_ref=f"{DDP}:stalls", model_name="stalls", role="A", steps=2, world_size=2)
    spec.write(tmp_path / "spec.json")
    results = []
    launcher = threading.Thread(target=lambda: results.append(backend.launch(spec, tmp_path / "spec.json", timeout=300)))
    launcher.start()
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("stalled.rank*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {p.name for p in tmp_path.glob("stalled.rank*")} == {"stalled.rank0", "stalled.rank1"}
    backend.close()
    launcher.join(timeout=30)
    assert not launcher.is_alive() and results[0].returncode != 0
    assert left_behind(tmp_path) == []  # torchrun, both ranks, and what each started


def test_more_ranks_than_gpus_is_named_before_any_rank_starts(monkeypatch):
    from reproci.worker import distributed

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert distributed.missing_gpus(2, torch.device("cuda")) == (
        "--world-size 2 needs 2 GPUs, one per rank, but this process sees 1: lower --world-size or make more GPUs visible")
    assert distributed.missing_gpus(1, torch.device("cuda")) is None
    assert distributed.missing_gpus(2, torch.device("cpu")) is None


def test_a_changed_nccl_algorithm_is_named_in_the_drift(tmp_path):
    document, records, states = fake_run(0)
    document["environment"]["env"] = {"NCCL_ALGO": "Ring"}
    golden.write(tmp_path, "img", document, records, states, plugins.stages())
    now, records_now, _ = fake_run(1)
    now["environment"]["env"] = {"NCCL_ALGO": "Tree"}
    section = drift.compare(now["models"][0], records_now["m"], None, now, golden.load(tmp_path, "img"), ci=False,
                            image_name="img")
    assert section.verdict == verdicts.ENV_CHANGED and section.message.endswith("(NCCL_ALGO Ring → Tree)")


def test_a_repeated_order_is_a_warning_beside_a_passing_verdict():
    import io

    from rich.console import Console

    from reproci.reports.terminal import print_report

    out, err = (Console(file=io.StringIO(), width=200, soft_wrap=True),  # as reproci.console makes them
                Console(file=io.StringIO(), width=200, soft_wrap=True))
    said = epochs.repeated(1, "first 2 batches compared")
    print_report({"models": [{"model": "m", "verdict": verdicts.PASS, "message": f"A = B = C; warning: {said}",
                              "epoch_order": said}], "image": {"name": "local"}}, out, err)
    assert f"warning: m: {said}" in err.file.getvalue()


@pytest.mark.parametrize("workflow, job, name", [
    ("reproci-check", "image", "Run the models in the image"),
    ("reproci-golden-update", "record", "Run the strict stage (and its cost) and record the golden"),
])
def test_the_workflows_pass_the_matrix_world_size_on(stub_reproci, tmp_path, workflow, job, name):
    step = step_named(load(workflow), job, name)
    env = {"IMAGE": "cuda12.6-torch2.7", "DEVICE": "cuda", "GPUS": "all", "PROFILE": "full", "RANKS": "2",
           "REPROCI_WEBHOOK": "", "STUB_ARGS": str(tmp_path / "args")}
    out, _ = run_step(step, env, tmp_path, stub_reproci, tmp_path)
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "args").read_text().split("\n")
    assert args[args.index("--world-size") + 1] == "2"


@pytest.mark.slow
def test_three_ranks_resume_exactly(tmp_path):
    """At 3 ranks a resumed run's fresh DDP used to reduce its first step with another bucket
    layout than run A's rebuilt one: 1 ULP in an all-reduce, RESUME_BROKEN. The harness's DDP
    keeps one layout from 3 ranks on (find_unused_parameters), and says so in the record."""
    out = Cli(tmp_path)("run", "-m", "embedding", "--world-size", "3", "--steps", "6", "--resume-at", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = Cli(tmp_path).latest()
    entry = model_entry(doc, "embedding")
    assert entry["verdict"] == verdicts.NEW and entry["message"].startswith("A = B = C"), entry["message"]
    rank2 = json.loads((tmp_path / "results" / doc["run_id"] / "embedding" / "record-C.rank2.json").read_text())
    assert rank2["distributed"]["ddp"]["find_unused_parameters"] is True


def test_a_plugins_own_ddp_that_rebuilds_its_buckets_is_named_as_the_cause():
    from reproci.golden.divergence import Divergence
    from reproci.stages.determinism import causes

    ev = Divergence(step=4, tensor="grad:top.2.weight", kind="grad", cause="compute",
                    op={"found": True, "op": "aten::allreduce_"})
    record = run_record(distributed={"world_size": 3, "ddp": {"wrapped_by": "plugin", "bucket_cap_mb": 25}})
    hint = causes.known_cause(verdicts.RESUME_BROKEN, ev, record)
    assert hint.startswith("the first resumed step differs in an all-reduce") and "this is torch's DDP, not the model" in hint
    record.distributed["ddp"]["find_unused_parameters"] = True
    assert causes.known_cause(verdicts.RESUME_BROKEN, ev, record) is None
    record.distributed.update(world_size=2, ddp={"wrapped_by": "plugin"})
    assert causes.known_cause(verdicts.RESUME_BROKEN, ev, record) is None


@pytest.mark.slow
def test_torchrun_keeps_its_files_in_the_run_directory(sharded):
    """Each torchrun launch made a ``torchelastic_*`` folder in the system's temporary directory
    and left it there (three per model). With its ``--log-dir`` in the run directory, a real run
    of two ranks adds none, and torchrun's folders are the run's own: one per launch, A, B and C
    and the throughput stage's two (one repetition of each mode)."""
    assert sharded["added"] == set()
    launches = list((sharded["work"] / "torchrun").iterdir())
    assert len(launches) == 3 + 2 == len(list(sharded["work"].glob("spec-*.json")))
