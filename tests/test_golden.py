"""The golden store: format, validation, atomic and concurrent writes."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

from reproci import atomic, errors, plugins
from reproci.errors import GoldenError
from reproci.golden import store as golden

from .helpers import ROOT, file_size_limit, record_json


def fake_run(seed: int = 0, torch_version: str = "2.13.0+cpu"):
    rng = np.random.default_rng(seed)
    names = ["param:w", "grad:w", "buffer:b", "optim:w.m"]
    fps = rng.integers(-2**40, 2**40, size=(5, 4)).tolist()
    digest = f"{seed:064x}"
    document = {
        "run_id": f"run-{seed}", "project_commit": "abc123", "image": {"name": "img", "reference": None, "digest": None},
        "options": {"profile": "quick", "device": "cpu", "threads": 1},
        "environment": {"torch": torch_version, "threads": {"intra_op": 1}},
        "packages": {"torch": torch_version, "numpy": "2.4.6"},
        "models": [{"model": "m", "ref": "m", "code_sha256": "c" * 64, "config_sha256": "d" * 64, "config": {"w": 1},
                    "steps": 5, "resume_at": 2, "seed": 0}],
    }
    records = {"m": record_json(final_sha256=digest, losses=[1.0, 0.5, 0.25, 0.125, 0.0625], tensor_names=names,
                                fingerprints=fps, batch_fingerprints=[1, 2, 3, 4, 5],
                                tensor_sha256={"param:w": "1" * 64})}
    states = {"m": {"param:w": torch.full((3,), float(seed)), "grad:w": torch.zeros(3)}}
    return document, records, states


def test_round_trip_keeps_everything_needed_to_bisect(tmp_path):
    doc, recs, states = fake_run(1)
    path = golden.write(tmp_path, "img", doc, recs, states, plugins.stages())
    text = path.read_text()
    assert text.startswith("# reproci golden hashes") and "final_sha256" in text
    assert "fingerprints" not in yaml.safe_load(text)["models"]["m"]  # bulky data lives in the sidecar
    g = golden.load(tmp_path, "img")
    m = g.models["m"]
    assert g.data["version"] == 1 and g.data["recorded"]["project_commit"] == "abc123"
    assert m.entry["final_sha256"] == recs["m"]["final_sha256"] and m.entry["losses"][-1] == 0.0625
    assert m.names == recs["m"]["tensor_names"] and m.fingerprints.tolist() == recs["m"]["fingerprints"]
    assert m.batch_fingerprints.tolist() == [1, 2, 3, 4, 5]
    assert m.state["param:w"].tolist() == [1.0, 1.0, 1.0] and "grad:w" not in m.state
    assert m.as_record().tensor_sha256 == {"param:w": "1" * 64}
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_rewrite_replaces_the_sidecar(tmp_path):
    golden.write(tmp_path, "img", *fake_run(1), plugins.stages())
    golden.write(tmp_path, "img", *fake_run(2), plugins.stages())
    assert len(list(tmp_path.glob("img.*.npz"))) == 1
    assert golden.load(tmp_path, "img").models["m"].state["param:w"].tolist() == [2.0] * 3


def test_missing_golden_is_none(tmp_path):
    assert golden.load(tmp_path, "nothing") is None


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t + "\nmodels: [\n", "not valid YAML"),
    (lambda t: "\0" * 100, "not valid YAML (character #x0000 at byte 0: special characters are not allowed)"),
    (lambda t: t.replace("version: 1", "version: 9"), "newer than this reproci reads"),
    (lambda t: t.replace("version: 1", "version: 0"), "re-record it with `reproci golden update --image img`"),
    (lambda t: t.replace("final_sha256: '0000", "final_sha256: 'zz00"), "key models.m.final_sha256"),
    (lambda t: t.replace("steps: 5", "steps: five"), "key models.m.steps"),
])
def test_corrupt_golden_names_file_and_key(tmp_path, mutate, fragment):
    path = golden.write(tmp_path, "img", *fake_run(1), plugins.stages())
    path.write_text(mutate(path.read_text()))
    with pytest.raises(GoldenError) as e:
        golden.load(tmp_path, "img")
    assert fragment in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_golden_of_nul_bytes_is_one_line(capsys, tmp_path):
    """A golden truncated to NUL bytes (a crash mid-write on some filesystems): `golden show`
    says so in one line, exit 6, as every other corrupt golden."""
    from reproci.cli import main

    (tmp_path / "img.yaml").write_bytes(b"\0" * 4096)
    code = main(["golden", "show", "img", "--goldens-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == errors.EXIT_GOLDEN and out == ""
    assert err == (f"error: {tmp_path}/img.yaml: not valid YAML (character #x0000 at byte 0: special characters "
                   "are not allowed); restore it from git or re-record with `reproci golden update --image img`\n")


def test_tampered_or_missing_sidecar_is_refused(tmp_path):
    golden.write(tmp_path, "img", *fake_run(1), plugins.stages())
    side = next(tmp_path.glob("img.*.npz"))
    side.write_bytes(side.read_bytes()[:-10])
    with pytest.raises(GoldenError, match="sidecar.sha256"):
        golden.load(tmp_path, "img")
    side.unlink()
    with pytest.raises(GoldenError, match="is missing"):
        golden.load(tmp_path, "img")


def test_interrupted_update_leaves_the_old_golden_intact(tmp_path, monkeypatch):
    golden.write(tmp_path, "img", *fake_run(1), plugins.stages())
    before = golden.load(tmp_path, "img").models["m"].entry["final_sha256"]
    real = atomic.write_bytes
    calls = []

    def interrupted(path, data, **kwargs):
        calls.append(path)
        if path.suffix == ".yaml":
            raise KeyboardInterrupt  # Ctrl-C after the new sidecar, before the YAML
        real(path, data, **kwargs)

    monkeypatch.setattr(atomic, "write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        golden.write(tmp_path, "img", *fake_run(2), plugins.stages())
    monkeypatch.undo()
    assert golden.load(tmp_path, "img").models["m"].entry["final_sha256"] == before
    assert not list(tmp_path.glob(".*.tmp"))
    golden.write(tmp_path, "img", *fake_run(3), plugins.stages())  # the next update cleans the orphan sidecar
    assert len(list(tmp_path.glob("img.*.npz"))) == 1


def test_a_golden_write_that_fails_half_way_leaves_the_previous_golden_whole(tmp_path):
    """Each file of a golden is written beside and renamed over: a write that fails part of the
    way through (past a file size limit, as on a full disk) leaves the previous golden loading
    as it was and no temporary file, whether the sidecar fails (nothing of the update is left)
    or the YAML after it (the old YAML whole; the new sidecar an orphan the next update removes)."""
    golden.write(tmp_path, "img", *fake_run(1), plugins.stages())
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    old = golden.load(tmp_path, "img").models["m"].entry["final_sha256"]

    doc, recs, states = fake_run(2)
    states["m"]["param:w"] = torch.from_numpy(np.random.default_rng(0).random(20_000))  # a sidecar of 160 KB
    with file_size_limit(32_768), pytest.raises(OSError):
        golden.write(tmp_path, "img", doc, recs, states, plugins.stages())
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert golden.load(tmp_path, "img").models["m"].entry["final_sha256"] == old

    doc, recs, states = fake_run(3)
    recs["m"]["losses"] = np.random.default_rng(0).random(4000).tolist()  # a YAML of 80 KB, a small sidecar
    with file_size_limit(32_768), pytest.raises(OSError):
        golden.write(tmp_path, "img", doc, recs, states, plugins.stages())
    assert (tmp_path / "img.yaml").read_bytes() == files["img.yaml"]
    assert golden.load(tmp_path, "img").models["m"].entry["final_sha256"] == old
    left = [p.name for p in tmp_path.iterdir() if p.name not in files]
    assert len(left) == 1 and left[0].startswith("img.") and left[0].endswith(".npz")  # whole: it failed at the YAML
    golden.write(tmp_path, "img", *fake_run(4), plugins.stages())
    assert len(list(tmp_path.glob("img.*.npz"))) == 1


@pytest.mark.parametrize("verdict", ["NEW", "NONDETERMINISTIC", "RESUME_BROKEN", "REPLICAS_DIVERGE", "ERROR"])
def test_a_golden_is_recorded_only_from_runs_reproducible_by_themselves(tmp_path, verdict):
    """The decision of `golden update` (and `run --update-golden`): a run that did not
    reproduce itself (A != B, a resume that differs, ranks that part) or did not complete is
    never recorded, beside a model that could be; its twin, NEW, is recorded."""
    from types import SimpleNamespace

    from reproci.golden import check

    document, records, _ = fake_run(1)
    run_dir = tmp_path / "results" / "run-1"
    (run_dir / "m").mkdir(parents=True)
    (run_dir / "m" / "record-A.json").write_text(json.dumps(records["m"]))
    document["models"] = [{**document["models"][0], "model": name, "verdict": v, "records": {"A": "m/record-A.json"}}
                          for name, v in (("m", "NEW"), ("n", verdict))]
    document["golden"] = {"updated": False}
    options = SimpleNamespace(goldens_dir=tmp_path / "goldens", image_name="img")
    check.update(options, document, run_dir, plugins.stages())  # type: ignore[arg-type]
    if verdict == "NEW":
        assert document["golden"]["updated"] is True and set(golden.load(tmp_path / "goldens", "img").models) == {"m", "n"}
        return
    assert document["golden"]["updated"] is False and not (tmp_path / "goldens").exists()
    assert document["golden"]["refused"] == (f"golden not updated: n is {verdict}; a golden is only recorded from runs "
                                             "that are reproducible by themselves")


WRITER = """
import sys, itertools
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from reproci import atomic, plugins
from reproci.golden import store as golden
from tests.test_golden import fake_run
for i in itertools.count(int(sys.argv[2])):
    golden.write(Path(sys.argv[1]), sys.argv[4], *fake_run(i % 50), plugins.stages())
"""


@pytest.mark.slow
def test_killed_writers_never_leave_a_broken_golden(tmp_path):
    """SIGKILL at random moments of real writer processes; every survivor state loads."""
    golden.write(tmp_path, "img", *fake_run(0), plugins.stages())
    rng = np.random.default_rng(0)
    for trial in range(6):
        before = (tmp_path / "img.yaml").stat().st_mtime_ns
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(trial * 7 + 1), str(ROOT), "img"], cwd=ROOT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (tmp_path / "img.yaml").stat().st_mtime_ns == before:
            time.sleep(0.02)  # wait for the writer's first update, then kill it mid-stream
        time.sleep(float(rng.uniform(0, 0.3)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        g = golden.load(tmp_path, "img")
        assert g is not None and len(g.models["m"].entry["final_sha256"]) == 64


@pytest.mark.slow
def test_concurrent_updates_of_different_images_do_not_clobber(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "0", str(ROOT), name], cwd=ROOT)
             for name in ("img-a", "img-b")]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all((tmp_path / f"{n}.yaml").exists() for n in ("img-a", "img-b")):
        time.sleep(0.1)
    time.sleep(1.0)  # both now rewrite their goldens in a loop
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    for name in ("img-a", "img-b"):
        g = golden.load(tmp_path, name)
        assert g is not None and g.models["m"].fingerprints.shape == (5, 4)


def test_partial_update_with_a_changed_environment_is_refused(tmp_path):
    doc, recs, states = fake_run(1)
    doc["models"].append({**doc["models"][0], "model": "n"})
    recs["n"] = recs["m"]
    golden.write(tmp_path, "img", doc, recs, states, plugins.stages())
    doc2, recs2, states2 = fake_run(2, torch_version="2.14.1")
    with pytest.raises(GoldenError, match="re-record every model together"):
        golden.write(tmp_path, "img", doc2, recs2, states2, plugins.stages())
    doc3, recs3, states3 = fake_run(3)  # same environment: the other model's entry is kept
    golden.write(tmp_path, "img", doc3, recs3, states3, plugins.stages())
    assert set(golden.load(tmp_path, "img").models) == {"m", "n"}


def test_golden_names_cannot_escape_the_directory(tmp_path):
    with pytest.raises(GoldenError):
        golden.path_for(tmp_path, "../etc")


def test_diff_of_goldens_recorded_with_other_settings_names_each_setting(tmp_path):
    from reproci.golden.image_diff import diff_goldens

    golden.write(tmp_path, "eager", *fake_run(1), plugins.stages())
    document, records, states = fake_run(2)
    document["models"][0].update(steps=30, execution={"compile": {"backend": "inductor", "mode": None}, "amp": "bf16"})
    golden.write(tmp_path, "compiled", document, records, states, plugins.stages())
    d = diff_goldens(golden.load(tmp_path, "eager"), golden.load(tmp_path, "compiled"))
    m = d["models"]["m"]
    assert m["status"] == "not comparable: steps 5 vs 30, eager fp32 vs compiled (inductor, mode default), bf16 autocast"
    assert "losses_agree_digits" not in m and "step" not in m  # nothing compared


@pytest.mark.parametrize("layout", ["git", "no-git"])
def test_a_plugin_is_recorded_by_its_path_in_the_repository(tmp_path, layout):
    """A committed golden names no machine: a plugin file inside the repository (the git work tree
    that holds the goldens folder, else the folder that holds it) by its path from there, one
    outside it by its absolute path, as it was before."""
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    if layout == "git":
        (repo / ".git").mkdir()
    goldens = repo / "ci" / "goldens" if layout == "git" else repo / "goldens"
    doc, recs, states = fake_run(1)
    doc["models"][0]["ref"] = f"{repo / 'models' / 'net.py'}:build"
    golden.write(goldens, "img", doc, recs, states, plugins.stages())
    assert golden.load(goldens, "img").models["m"].entry["ref"] == "models/net.py:build"
    assert str(tmp_path) not in (goldens / "img.yaml").read_text()
    doc["models"][0]["ref"] = f"{tmp_path / 'elsewhere' / 'net.py'}:build"
    golden.write(goldens, "img", doc, recs, states, plugins.stages())
    assert golden.load(goldens, "img").models["m"].entry["ref"] == f"{tmp_path / 'elsewhere' / 'net.py'}:build"


def test_a_golden_recorded_with_an_absolute_plugin_path_still_reads(cli, tmp_path):
    """Goldens recorded before paths were relative name the plugin's absolute path: they still load and show."""
    doc, recs, states = fake_run(1)
    goldens = tmp_path / "goldens"
    doc["models"][0]["ref"] = f"{tmp_path / 'net.py'}:build"
    path = golden.write(goldens, "img", doc, recs, states, plugins.stages())
    path.write_text(path.read_text().replace("ref: net.py:build\n", f"ref: {tmp_path / 'net.py'}:build\n"))
    assert golden.load(goldens, "img").models["m"].entry["ref"] == f"{tmp_path / 'net.py'}:build"
    code, out, err = cli("golden", "show", "img", "--goldens-dir", str(goldens))
    assert code == 0 and "m" in out, err
