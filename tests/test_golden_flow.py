"""Goldens end to end: record, match, drift verdicts, CI mode, alerts. Real runs, real HTTP server."""

import http.server
import json
import shutil
import socket
import threading

import pytest
import yaml

from reproci import errors

from .helpers import Cli, model_entry

pytestmark = pytest.mark.slow
SHORT = ("--steps", "4", "--resume-at", "2", "--jobs", "2")  # every difference here shows from step 1


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Goldens for conv and embedding, recorded once for the module: ``local`` at 1 thread, and
    ``two-threads`` at 2 (another image's golden with other hashes, for diff and for an upgrade)."""
    base = tmp_path_factory.mktemp("golden")
    cli = Cli(base)
    p = cli("golden", "update", "-m", "conv", "-m", "embedding", *SHORT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "golden recorded: goldens/local.yaml" in p.stdout
    p = cli("golden", "update", "-m", "conv", "-m", "embedding", "--threads", "2", "--image-name", "two-threads", *SHORT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "golden recorded: goldens/two-threads.yaml" in p.stdout
    return base


@pytest.fixture
def workspace(recorded, tmp_path):
    shutil.copytree(recorded / "goldens", tmp_path / "goldens")
    return Cli(tmp_path)


def test_a_matching_run_passes_and_a_golden_edited_to_differ_is_golden_mismatch(workspace):
    """conv's golden as recorded: PASS. embedding's final hash edited in the golden: its runs
    agree, and the image, packages and host are the golden's, so nothing recorded explains the
    difference: GOLDEN_MISMATCH, exit 3, with no re-run (nothing to set back)."""
    path = workspace.cwd / "goldens" / "local.yaml"
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    data = yaml.safe_load(path.read_text())
    recorded = data["models"]["embedding"]["final_sha256"]
    data["models"]["embedding"]["final_sha256"] = "0" * 64
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    p = workspace("run", "-m", "conv", "-m", "embedding", *SHORT)
    assert p.returncode == errors.EXIT_DRIFT, p.stdout + p.stderr
    doc = workspace.latest()
    conv = model_entry(doc, "conv")
    assert conv["verdict"] == "PASS" and conv["golden"]["verdict"] == "PASS"
    assert conv["golden"]["golden_final_sha256"] == conv["final_sha256"]
    emb = model_entry(doc, "embedding")
    assert emb["verdict"] == "GOLDEN_MISMATCH" and emb["golden"]["verdict"] == "GOLDEN_MISMATCH", emb["message"]
    assert emb["final_sha256"] == recorded and {r["final_sha256"] for r in emb["runs"].values()} == {recorded}
    assert emb["golden"]["golden_final_sha256"] == "0" * 64
    assert emb["golden"]["env_diff"] == {} and emb["golden"]["package_diff"] == {}
    assert "same image, packages and host: nothing recorded differs" in emb["message"]
    assert "confirmation" not in emb["golden"]
    assert f"embedding: GOLDEN_MISMATCH: {emb['message']}" in " ".join(p.stdout.split())


def test_thread_count_change_is_env_changed_with_its_diff(workspace):
    p = workspace("run", "-m", "conv", "-m", "embedding", "--threads", "2", *SHORT)
    assert p.returncode == errors.EXIT_DRIFT, p.stdout + p.stderr
    doc = workspace.latest()
    conv = model_entry(doc, "conv")
    assert conv["verdict"] == "ENV_CHANGED"
    assert conv["golden"]["env_diff"] == {"threads.intra_op": [1, 2]}
    ev = conv["golden"]["evidence"]
    assert ev["step"] == 1 and ev["tensor"].startswith(("grad:", "buffer:"))
    assert ev["max_abs"] > 0 and ev["max_ulp"] >= 1
    assert "(threads 1 → 2)" in conv["message"]
    # the thread count can be set from software: one more run with the golden's proves it
    assert conv["golden"]["confirmation"]["confirmed"] is True and conv["golden"]["confirmation"]["settings"] == {"threads": 1}
    assert conv["message"].endswith("; confirmed: with --threads 1 (the golden's), conv matches the golden bit for bit "
                                    "through step 2: the thread count is the cause")
    # Whether the thread count moves embedding depends on the host's kernels (an AMD EPYC: no; an
    # Intel Xeon with AMX: yes): either it passes, or it is ENV_CHANGED for the same proven reason.
    emb = model_entry(doc, "embedding")
    if emb["verdict"] != "PASS":
        assert emb["verdict"] == "ENV_CHANGED" and emb["golden"]["env_diff"] == {"threads.intra_op": [1, 2]}, emb["message"]
        assert emb["golden"]["confirmation"]["confirmed"] is True, emb["message"]


def test_golden_from_other_packages_is_upgrade_changed(workspace):
    path = workspace.cwd / "goldens" / "two-threads.yaml"  # the "old image": recorded with other hashes
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    data = yaml.safe_load(path.read_text())
    data["packages"]["torch"] = "2.12.0+cpu"
    data["environment"]["torch"] = "2.12.0+cpu"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    p = workspace("run", "-m", "conv", "--image-name", "two-threads", *SHORT)
    assert p.returncode == errors.EXIT_DRIFT
    conv = model_entry(workspace.latest(), "conv")
    assert conv["verdict"] == "UPGRADE_CHANGED"
    assert conv["golden"]["package_diff"]["torch"] == ["2.12.0+cpu", conv["golden"]["package_diff"]["torch"][1]]
    assert "torch 2.12.0+cpu →" in conv["message"]


def test_changed_seed_is_model_changed_not_an_alert(workspace):
    p = workspace("run", "-m", "embedding", "--seed", "1", *SHORT)
    assert p.returncode == 0
    e = model_entry(workspace.latest(), "embedding")
    assert e["verdict"] == "MODEL_CHANGED" and "seed" in e["golden"]["identity_diff"]


def test_ci_mode_fails_on_a_missing_golden_and_names_the_fix(workspace):
    p = workspace("run", "-m", "embedding", "--image-name", "brand-new", *SHORT, env={"CI": "true"})
    assert p.returncode == errors.EXIT_DRIFT
    # a notice (here an error): stderr; the local backend, recorded under the run's own golden name
    assert "`reproci golden update --image local --image-name brand-new -m embedding --steps 4 --resume-at 2`" in p.stderr
    p = workspace("run", "-m", "embedding", "--image-name", "brand-new", *SHORT)
    assert p.returncode == 0 and model_entry(workspace.latest(), "embedding")["verdict"] == "NEW"


def test_corrupt_golden_is_a_clean_error_before_any_run(workspace):
    (workspace.cwd / "goldens" / "local.yaml").write_text("version: 1\nmodels: {conv: {final_sha256: nope, steps: 8}}\n")
    p = workspace("run", "-m", "embedding", *SHORT)
    assert p.returncode == errors.EXIT_GOLDEN
    assert "key models.conv.final_sha256" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (workspace.cwd / "results").exists()


def test_update_is_refused_from_a_nondeterministic_run(workspace):
    before = (workspace.cwd / "goldens" / "local.yaml").read_text()
    p = workspace("golden", "update", "-m", "conv", "--fault", "buffer-drift", *SHORT)
    assert p.returncode == errors.EXIT_REPRO_FAILURE
    assert "golden not updated: conv is NONDETERMINISTIC" in p.stderr
    assert (workspace.cwd / "goldens" / "local.yaml").read_text() == before


def test_show_and_diff(workspace):
    p = workspace("golden", "show", "local")
    assert p.returncode == 0 and "conv" in p.stdout and "torch 2.13.0" in p.stdout
    p = workspace("golden", "diff", "local", "two-threads")
    assert p.returncode == 0
    assert "threads.intra_op: 1 → 2" in p.stdout
    conv_line = next(line for line in p.stdout.splitlines() if line.startswith("│ conv"))
    assert "differs" in conv_line and "step 1" in conv_line
    # whether the thread count moves embedding is the host's kernels' to say: diff tells what the goldens hold
    finals = [yaml.safe_load((workspace.cwd / "goldens" / f"{name}.yaml").read_text())["models"]["embedding"]["final_sha256"]
              for name in ("local", "two-threads")]
    said = next(line for line in p.stdout.splitlines() if line.startswith("│ embedding"))
    assert ("identical" in said) == (finals[0] == finals[1]) and ("differs" in said) == (finals[0] != finals[1]), said
    p = workspace("golden", "show", "nope")
    assert p.returncode == errors.EXIT_USAGE and "known: local, two-threads" in p.stderr  # a wrong name, not a corrupt file


class Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    fail_first = 0

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        if cls.fail_first > 0:
            cls.fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        cls.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook_server():
    Hook.received = []
    Hook.fail_first = 1  # the first delivery fails: the alert must be retried
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def test_drift_alerts_reach_webhook_annotations_and_step_summary(workspace, hook_server, tmp_path):
    summary = tmp_path / "summary.md"
    p = workspace("run", "-m", "conv", "--threads", "2", "--webhook", hook_server, *SHORT,
                  env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert p.returncode == errors.EXIT_DRIFT
    assert len(Hook.received) == 1
    msg = Hook.received[0]
    assert "ENV_CHANGED" in msg["text"] and "conv" in msg["text"] and msg["blocks"]
    assert "::warning title=reproci conv on local%3A ENV_CHANGED::ENV_CHANGED: differs from the golden" in p.stdout
    md = summary.read_text()
    assert "| conv | ⚠️ **ENV_CHANGED** |" in md and "step 1" in md
    assert workspace.latest()["alerts"]["webhook"] == {"ok": True, "attempts": 2, "status": 200, "error": None}


def test_dead_webhook_never_changes_the_verdict(workspace):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    p = workspace("run", "-m", "conv", "--threads", "2", "--webhook", f"http://127.0.0.1:{port}/x", *SHORT)
    assert p.returncode == errors.EXIT_DRIFT
    assert "webhook alert not delivered after 3 attempt(s)" in p.stderr
    doc = workspace.latest()
    assert doc["alerts"]["webhook"]["ok"] is False and model_entry(doc, "conv")["verdict"] == "ENV_CHANGED"


def test_the_new_notice_advice_runs_as_printed(reproci):
    """The NEW notice tells a first-time user how to record a golden: that command, exactly as
    printed (it carries the run's own models, steps and resume point), must work."""
    import re
    import shlex

    short = ("-m", "embedding", "--steps", "4", "--resume-at", "2")
    p = reproci("run", *short)
    assert p.returncode == 0, p.stderr
    advice = re.search(r"`(reproci golden update[^`]*)`", p.stderr).group(1)  # a notice: stderr
    assert advice == "reproci golden update --image local -m embedding --steps 4 --resume-at 2"
    q = reproci(*shlex.split(advice)[1:])
    assert q.returncode == 0, q.stdout + q.stderr
    assert (reproci.cwd / "goldens" / "local.yaml").is_file()
    r = reproci("run", *short)
    assert r.returncode == 0 and reproci.latest()["models"][0]["verdict"] == "PASS"
