"""``--across-nodes``: a model's cell and its twin on another node, compared (``cluster/across.py``).

These need no cluster: the comparison reads two real records of the conv model's run A (8 steps,
quick profile, torch 2.13.0+cpu), one recorded where ATen picked AVX512 kernels, the other on the
same host with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` (tests/records/, trimmed to
what a comparison reads). The twin on a real Ray cluster is in tests/test_ray.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reproci import errors, plugins, verdicts
from reproci.cluster import across, cell

RECORDS = Path(__file__).parent / "records"
NODE, TWIN = "10.0.0.1 (aaaaaaaa)", "10.0.0.2 (bbbbbbbb)"


def cell_run(tmp_path: Path, node: str, record: dict[str, Any], verdict: str = verdicts.PASS) -> across.CellRun:
    """A cell's run directory holding run A's record, and its model entry."""
    run_dir = tmp_path / node.split()[0]
    (run_dir / "conv").mkdir(parents=True)
    (run_dir / "conv" / "record-A.json").write_text(json.dumps(record))
    entry = {"model": "conv", "verdict": verdict, "message": "A = B = C: bitwise reproducible, resume exact",
             "records": {"A": "conv/record-A.json"}}
    return across.CellRun(node=node, entry=entry, run_dir=run_dir)


def record(isa: str) -> dict[str, Any]:
    return json.loads((RECORDS / f"conv-A-{isa}.json").read_text())


def test_runs_that_agree_leave_the_verdict_and_say_on_which_nodes(tmp_path):
    first, twin = cell_run(tmp_path, NODE, record("avx512")), cell_run(tmp_path, TWIN, record("avx512"))
    section = across.compare(first, twin, "cpu")
    assert section["agree"] is True and section["verdict"] is None
    entry = dict(first.entry)
    across.judge(entry, section, twin.entry)
    assert entry["verdict"] == verdicts.PASS
    assert entry["message"].endswith(f"agreed across nodes {NODE} and {TWIN} (run A: every step and the final hash)")


def test_runs_that_differ_on_nodes_whose_kernels_differ_are_the_environment_not_nondeterminism(tmp_path):
    first, twin = cell_run(tmp_path, NODE, record("avx512")), cell_run(tmp_path, TWIN, record("avx2"))
    section = across.compare(first, twin, "cpu")
    entry = dict(first.entry)
    across.judge(entry, section, twin.entry)
    assert section["agree"] is False and entry["verdict"] == verdicts.ENV_CHANGED
    assert section["env_diff"]["cpu_capability"] == ["AVX512", "AVX2"]
    step, tensor = section["evidence"]["step"], section["evidence"]["tensor"]
    assert step is not None and tensor
    assert entry["message"].startswith(f"runs on {NODE} and {TWIN} differ from step {step}, first at {tensor}")
    assert "the nodes differ: CPU capability (ATen) AVX512 → AVX2" in entry["message"]
    assert "ATEN_CPU_CAPABILITY (unset) → avx2" in entry["message"]
    assert verdicts.first_difference(verdicts.verdict_evidence(entry)).startswith(f"step {step}, {tensor}")


def test_runs_that_differ_on_nodes_of_one_environment_are_nondeterministic(tmp_path):
    """The AVX2 run's numbers under the AVX512 run's environment: a difference the fingerprints
    do not explain (a factor reproci does not record) is nondeterminism across machines."""
    hidden = {**record("avx2"), "environment": record("avx512")["environment"], "packages": record("avx512")["packages"]}
    first, twin = cell_run(tmp_path, NODE, record("avx512")), cell_run(tmp_path, TWIN, hidden)
    section = across.compare(first, twin, "cpu")
    entry = dict(first.entry)
    across.judge(entry, section, twin.entry)
    assert entry["verdict"] == verdicts.NONDETERMINISTIC and section["env_diff"] == {}
    assert verdicts.exit_code([entry["verdict"]]) == errors.EXIT_REPRO_FAILURE
    assert entry["message"].startswith(f"runs on {NODE} and {TWIN} differ from step {section['evidence']['step']}")
    assert entry["message"].endswith("the nodes' environments are the same: nondeterminism across machines")


def test_a_failure_on_either_node_is_the_models_verdict(tmp_path):
    first = cell_run(tmp_path, NODE, record("avx512"), verdicts.RESUME_BROKEN)
    twin = cell_run(tmp_path, TWIN, record("avx2"), verdicts.NONDETERMINISTIC)
    entry = dict(first.entry)
    across.judge(entry, across.compare(first, twin, "cpu"), twin.entry)
    assert entry["verdict"] == verdicts.RESUME_BROKEN  # the first node's own failure stands
    clean = cell_run(tmp_path / "clean", NODE, record("avx512"))
    entry = dict(clean.entry)
    across.judge(entry, across.compare(clean, twin, "cpu"), twin.entry)
    assert entry["verdict"] == verdicts.NONDETERMINISTIC and entry["message"].startswith(f"on node {TWIN}: ")


def test_a_twin_goes_to_the_next_node_and_records_no_golden():
    spec = cell.CellSpec(name="conv@local", model="conv", options={}, goldens_dir="goldens", update_golden=True)
    assert across.placements(["n1", "n2", "n3"], 2, spec, False) == [("n3", spec)]
    (here, mine), (there, twin) = across.placements(["n1", "n2", "n3"], 2, spec, True)
    assert (here, there) == ("n3", "n1")
    assert mine.update_golden and mine.keep_checkpoints  # run A's final state comes back for the magnitude
    assert twin.name == "conv@local~twin" and not twin.update_golden and twin.keep_checkpoints


def test_fewer_than_two_nodes_cannot_hold_a_twin():
    spec = cell.CellSpec(name="conv@local", model="conv", options={}, goldens_dir="goldens")
    with pytest.raises(errors.UsageError, match=r"two nodes, and 1 node of the cluster can take these cells") as e:
        across.placements(["n1"], 0, spec, True)
    assert e.value.return_code == errors.EXIT_USAGE


def test_across_nodes_without_a_cluster_is_a_one_line_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--across-nodes", "-m", "conv")
    assert code == errors.EXIT_USAGE and err.count("error:") == 1, err
    assert "--across-nodes runs each model's cell on two nodes of a cluster: add --backend ray" in err
    assert not (tmp_path / "results").exists()


def test_a_difference_across_nodes_refuses_the_golden_and_is_recorded(tmp_path):
    """``check`` as an engine calls it: the twin's run directory kept under across-nodes/, the
    option in the results' options, no golden from nodes that disagree."""
    import io
    import tarfile

    first = cell_run(tmp_path, NODE, record("avx512"))
    twin_dir = cell_run(tmp_path, TWIN, record("avx2")).run_dir
    (twin_dir / "results.json").write_text(json.dumps({"models": [dict(first.entry)]}))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(twin_dir, arcname=".")
    result = cell.CellResult(name="conv@local~twin", exit_code=0, run_tar=buf.getvalue(), golden_files={},
                             host="h", node_ip="10.0.0.2", seconds=1.0, stderr_tail=[])
    doc: dict[str, Any] = {"options": {}, "models": [dict(first.entry)], "golden": {"updated": False}}
    shutil.rmtree(twin_dir)

    class Options:
        update_golden, keep_checkpoints, device = True, False, "cpu"
        catalog = plugins.catalog()  # the stages the command line composed

    across.check(Options(), doc, first.run_dir, [across.Twin(node=NODE, twin_node=TWIN, result=result)])  # type: ignore[arg-type]
    m = doc["models"][0]
    assert m["verdict"] == verdicts.ENV_CHANGED and doc["options"]["across_nodes"] is True
    assert (first.run_dir / m["across_nodes"]["twin_run_dir"] / "conv" / "record-A.json").is_file()
    assert doc["golden"]["refused"].startswith(f"golden not updated: conv differs across nodes {NODE} and {TWIN}")
    assert doc["summary"]["exit_code"] == errors.EXIT_DRIFT
