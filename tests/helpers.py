"""What several test modules share: the real CLI in a subprocess, the optional libraries a
module needs, every process a run started (and what it left running), real results files made
once per session, and the workflow files with a runner for their steps."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NoReturn

import pytest
import yaml

from reproci import verdicts
from reproci.worker.run_record import RunRecord, Timings

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "tests" / "plugins"
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = {name: WORKFLOWS / f"{name}.yml" for name in ("reproci", "golden-update", "ci")}


class Cli:
    """Drives the real ``reproci`` command in a subprocess, in a scratch directory; ``pid`` is
    the last one's process id (what its workers and containers are labelled with)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.pid: int | None = None

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        # PYTEST_CURRENT_TEST changes with every test: runs would need a fork server of their own
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "PYTEST_CURRENT_TEST")}
        full_env.update({"CI": "", "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})})
        with subprocess.Popen([sys.executable, "-m", "reproci.cli", *args], cwd=self.cwd, env=full_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            self.pid = proc.pid
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def latest(self) -> dict:
        return json.loads((self.cwd / "results" / "latest.json").read_text())


def installed(*names: str) -> list[Any]:
    """The optional libraries a test module needs, imported. A library that is not installed at
    all skips the module (the test extra installs it: CI lists the skip); any other ImportError,
    in the library or in the project's code around it, is raised: a failure, never a skip."""
    import importlib
    import importlib.util

    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (`pip install -e '.[test]'` installs it)", allow_module_level=True)
    return [importlib.import_module(n) for n in names]


def unavailable(switch: str, problem: str) -> NoReturn:
    """Skip a test for want of an optional tool (``problem`` says which, and how to get it), or
    fail it where ``REPROCI_REQUIRE_<switch>=1`` says the tool is required (``.ci/run`` sets
    the switches of what CI installs): a required test never passes by skipping."""
    if os.environ.get(f"REPROCI_REQUIRE_{switch}") == "1":
        pytest.fail(f"REPROCI_REQUIRE_{switch}=1 but {problem}")
    pytest.skip(problem)


def docker_client(*images: str) -> Any:
    """The Docker SDK client, with ``images`` present; skip (or fail under REPROCI_REQUIRE_DOCKER=1)
    without an engine or an image. The caller closes it."""
    import docker

    problem = None
    try:
        client = docker.from_env()
        client.ping()
        for ref in images:
            try:
                client.images.get(ref)
            except docker.errors.ImageNotFound:
                problem = f"image {ref} is missing: run `bash .ci/docker-setup.sh`"
    except docker.errors.DockerException as e:
        problem = f"no Docker engine answers ({e}): run `bash .ci/docker-setup.sh`"
    if problem:
        unavailable("DOCKER", problem)
    return client


def params_of(command: Any) -> list[Any]:
    """A command's parameters as ``reproci`` gives them, its help option aside: with the stages the
    command line composes, which the commands that run them take their options from
    (``commands.run.RunCommand``)."""
    import click

    from reproci import plugins

    ctx = click.Context(command, obj=plugins.stages())
    return [p for p in command.get_params(ctx) if p is not command.get_help_option(ctx)]


def said(stderr: str) -> list[str]:
    """What reproci said on stderr, its progress lines (``[  12.3 s] conv: run A ...``) aside."""
    return [line for line in stderr.strip().splitlines() if not re.match(r"^\[\s*\d+\.\d s\] ", line)]


def run_record(**fields: Any) -> RunRecord:
    """A finished run's record as a test makes one: the fields it names, the rest empty."""
    timings = fields.pop("timings", None)
    base: dict[str, Any] = dict(
        model="m", model_ref="m", role="A", mode="strict", seed=0, start_step=0, end_step=len(fields.get("losses") or []),
        steps=len(fields.get("losses") or []), fault=None, fault_detail=None, attestation={"ok": True}, attestations={},
        controls=None, replayed=None, loader=None, environment={}, packages=None, config={}, batch_size=None,
        accumulate=1, initial_fingerprint=None, batch_checksum=None, fingerprint_scheme=None, tensor_names=[],
        fingerprints=[], batch_fingerprints=[], batch_contents_scheme=None, batch_contents=[], batch_opaque=[],
        batch_epochs=[], losses=[], final_sha256=None, tensor_sha256={}, step_times_s=[], data_times_s=[],
        steps_per_s=None, samples_per_s=None, peak_memory_bytes=None, peak_memory_kind=None, profiled_steps=0,
        cpus=None, steady_allocator=False, ops=None, execution=None, compile_cache=None, compile_attestation=None,
        scaler_state=None, perturbed=None, checkpoint_at=None, census=None, extra_state_sha256=None, distributed=None)
    return RunRecord(**{**base, **fields}, timings=Timings(**(timings or {"setup_s": 0.0, "train_s": 0.0,
                                                                          "timed_steps": 0, "timed_s": 0.0})))


def record_json(**fields: Any) -> dict[str, Any]:
    """A record file's JSON object (``run_record``), as a test writes one."""
    return run_record(**fields).to_json()


def model_entry(doc: dict, name: str) -> dict:
    return next(m for m in doc["models"] if m["model"] == name)


def interruptible() -> None:
    """``preexec_fn`` for a CLI that a test will interrupt: Ctrl-C as at a terminal, even when
    the test run itself was started in the background (which ignores SIGINT, and children
    inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- what a run started, and what it left running ---

@dataclass(frozen=True)
class Proc:
    """A live process as /proc shows it; ``why`` says how it was found to belong to a run."""

    pid: int
    ppid: int
    sid: int
    cwd: str
    cmdline: str
    label: str | None  # REPROCI_PARENT_PID in its environment: the reproci process that launched it
    why: str = ""

    def works_in(self, path: Path) -> bool:
        return self.cwd == str(path) or self.cwd.startswith(f"{path}{os.sep}")

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.why}; {self.cmdline[:160]!r} in {self.cwd})"


def _proc(pid: int) -> Proc | None:
    """The process ``pid``, or None where it is gone, a zombie (dead, not yet reaped) or unreadable."""
    base = Path("/proc") / str(pid)
    try:
        stat = (base / "stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        if fields[0] in ("Z", "X"):
            return None
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        cwd = os.readlink(base / "cwd")
        environ = (base / "environ").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return None
    label = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"REPROCI_PARENT_PID=")), None)
    return Proc(pid, int(fields[1]), int(fields[3]), cwd, cmdline, label)


def started_by(where: Path | None = None, *, pid: int | None = None) -> list[Proc]:
    """Every live process a run started: workers (fresh or forked from a fork server), fork
    servers, torchrun and its ranks, loader workers, and whatever those started.

    Found by working directory (a run works in its spec's directory under ``where``; a fresh
    one names its spec there on its command line too), by label (the reproci process ``pid``
    puts its own pid in every launch environment as REPROCI_PARENT_PID: fork servers work in
    the code's root, not under ``where``), then by session and parentage (torchrun starts each
    rank in a session of its own; a run's own children stay in its session even once
    reparented). This process, its ancestors, ``pid`` itself and this process's session are
    never counted: the test and the reproci under test are not what a run started."""
    mine = os.getsid(0)
    own = {os.getpid(), *([pid] if pid else [])}
    ancestor = os.getppid()
    while ancestor > 1 and ancestor not in own:
        own.add(ancestor)
        parent = _proc(ancestor)
        ancestor = parent.ppid if parent else 0
    procs = [p for p in map(_proc, (int(d) for d in os.listdir("/proc") if d.isdigit())) if p and p.pid not in own]
    found: dict[int, Proc] = {}
    for p in procs:
        if where is not None and p.works_in(where):
            found[p.pid] = dataclasses.replace(p, why=f"works in {where}")
        elif where is not None and re.search(re.escape(str(where)) + r"(?=[/\s]|$)", p.cmdline):
            found[p.pid] = dataclasses.replace(p, why=f"names {where}")
        elif pid is not None and p.label == str(pid):
            found[p.pid] = dataclasses.replace(p, why=f"labelled REPROCI_PARENT_PID={pid}")
    grew = True
    while grew:
        sessions = {p.sid for p in found.values()} - {mine}
        more = {p.pid: dataclasses.replace(p, why=f"in session {p.sid}" if p.sid in sessions else f"child of {p.ppid}")
                for p in procs if p.pid not in found and (p.sid in sessions or p.ppid in found)}
        found.update(more)
        grew = bool(more)
    return sorted(found.values(), key=lambda p: p.pid)


def standing_servers(folder: Path) -> list[Proc]:
    """The live standing fork servers of ``folder`` (``REPROCI_FORK_SERVERS``), not the runs
    they forked (whose command line is theirs: a fork does not exec)."""
    mark = f"--stand {folder}{os.sep}"
    marked = [p for p in map(_proc, (int(d) for d in os.listdir("/proc") if d.isdigit())) if p and mark in p.cmdline]
    return [p for p in marked if p.ppid not in {q.pid for q in marked}]


def stop_standing_servers(folder: Path) -> None:
    """Kill the standing fork servers of ``folder`` (their runs die with them)."""
    for p in standing_servers(folder):
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def left_behind(where: Path | None = None, *, pid: int | None = None, engine: Any = None,
                within: float = 10.0) -> list[str]:
    """What a finished or stopped run left running (``started_by``), and with ``engine`` (a
    Docker client) the containers labelled ``reproci.pid=PID``, in any state; waits up to
    ``within`` seconds for processes that are being killed to go. Empty when nothing is left."""
    import time

    deadline = time.monotonic() + within
    while True:
        left = [str(p) for p in started_by(where, pid=pid)]
        if engine is not None and pid is not None:
            left += [f"container {c.id[:12]} ({c.labels.get('reproci', '?')}, {c.status})"
                     for c in engine.containers.list(all=True, filters={"label": f"reproci.pid={pid}"},
                                                   ignore_removed=True)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# --- the declared shape of a results document ---

def undeclared(value: Any, kind: Any = None, path: str = "document") -> list[str]:
    """Every key of a results document (or of any part of it, ``kind`` its declared type) that its
    declaration does not name, at any depth a ``TypedDict`` reaches: 'document.models[].throughput.x'."""
    import types
    import typing

    from reproci import results

    kind = results.ResultsDocument if kind is None else kind
    if kind is results.ModelEntry and isinstance(value, dict):  # a stage's section: its result's declaration
        from reproci import plugins

        own = {s.name: s.result for s in plugins.stages() if s.result is not None}
        return [*_keys(results.ModelEntry, {k: v for k, v in value.items() if k not in own}, path),
                *(p for k, v in value.items() if k in own for p in undeclared(v, own[k], f"{path}.{k}"))]
    if dataclasses.is_dataclass(kind) and isinstance(value, dict):  # a section read by reproci.typed
        from reproci import typed

        names = {typed.json_name(f): f.name for f in dataclasses.fields(kind)}
        hints = typing.get_type_hints(kind, include_extras=True)
        return [p for k, v in value.items()
                for p in (undeclared(v, hints[names[k]], f"{path}.{k}") if k in names else [f"{path}.{k}"])]
    if getattr(kind, "__metadata__", None):  # Annotated, as WarningText
        kind = typing.get_args(kind)[0]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):  # the member of the value's own kind
        shaped = [t for t in args if (typing.is_typeddict(t) or dataclasses.is_dataclass(t)) and isinstance(value, dict)
                  or typing.get_origin(t) in (dict, list) and isinstance(value, typing.get_origin(t))]
        return undeclared(value, shaped[0], path) if shaped else []
    if typing.is_typeddict(kind) and isinstance(value, dict):
        return _keys(kind, value, path)
    if origin is dict and isinstance(value, dict):
        return [p for k, v in value.items() for p in undeclared(v, args[1], f"{path}[{k!r}]")]
    if origin is list and isinstance(value, list):
        return [p for v in value for p in undeclared(v, args[0], f"{path}[]")]
    return []


def _keys(kind: Any, value: dict[str, Any], path: str) -> list[str]:
    import typing

    hints = typing.get_type_hints(kind, include_extras=True)
    return [p for k, v in value.items() for p in (undeclared(v, hints[k], f"{path}.{k}") if k in hints else [f"{path}.{k}"])]


# --- real results files ---

RUN = ("run", "-m", "embedding", "--steps", "8", "--resume-at", "4", "--image-name", "cpu-torch2.13")
_CACHE: dict[str, dict[str, Path]] = {}


def real_results(factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real results files, made once per test session (shared with tests/test_prbody.py).

    recorded: a run that recorded the golden (--update-golden); compared: a later run of the
    same image compared against that golden; drifted / failed: copies edited to stand for a
    CUDA image whose golden changed and one whose runs disagreed.
    """
    if "files" in _CACHE:
        return _CACHE["files"]
    work = factory.mktemp("real-results")
    cli = Cli(work)
    first = cli(*RUN, "--results-dir", "recorded", "--goldens-dir", "goldens", "--update-golden")
    assert first.returncode == 0, first.stderr
    second = cli(*RUN, "--results-dir", "compared", "--goldens-dir", "goldens")
    assert second.returncode == 0, second.stderr
    recorded = next((work / "recorded").glob("*/results.json"))
    compared = next((work / "compared").glob("*/results.json"))
    base = json.loads(compared.read_text())

    drifted = edit(base, image={"name": "cuda12.6-torch2.7", "reference": "reproci/cuda12.6-torch2.7:1",
                                "digest": "sha256:" + "b" * 64, "backend": "docker"})
    model = drifted["models"][0]
    model["verdict"] = verdicts.UPGRADE_CHANGED
    model["message"] = "runs agree, golden differs: torch 2.7.0 -> 2.7.1"
    model["golden"] = {
        "verdict": verdicts.UPGRADE_CHANGED, "message": "final hash differs from the golden; torch changed",
        "file": "goldens/cuda12.6-torch2.7.yaml", "golden_final_sha256": "c" * 64,
        "golden_image": {"name": "cuda12.6-torch2.7", "reference": "reproci/cuda12.6-torch2.7:0",
                         "digest": "sha256:" + "a" * 64},
        "package_diff": {"torch": ["2.7.0", "2.7.1"], "nvidia-cudnn-cu12": ["9.5.1.17", "9.7.0.66"],
                         "triton": [None, "3.3.1"]},
        "env_diff": {"gpu.driver": ["550.54", "570.86"]},
        "evidence": {"step": 3, "tensor": "param:tables.0.weight", "kind": "param", "max_abs": 2.384e-07,
                     "max_ulp": 2, "losses_agree_digits": 6},
    }
    model["throughput"] = {
        "modes": {"strict": {"steps_per_s": 41.5}, "default": {"steps_per_s": 51.2}},
        "slowdown": {"median": 1.234, "ci_low": 1.2, "ci_high": 1.26, "noisy": False},
        "top_ops": [{"op": "aten::index_add_", "strict_ms": 3.1, "default_ms": 1.2, "share": 0.61}],
    }
    summarise(drifted)

    failed = edit(base, image={"name": "cuda12.4-torch2.5", "reference": "reproci/cuda12.4-torch2.5:1",
                               "digest": "sha256:" + "d" * 64, "backend": "docker"})
    model = failed["models"][0]
    model["verdict"] = verdicts.NONDETERMINISTIC
    model["message"] = "A ≠ B from step 2, first at grad:mlp.0.weight\nmax |Δ| 1.19e-07: 100% sure"
    model["evidence"] = {"comparison": "A vs B", "step": 2, "tensor": "grad:mlp.0.weight", "kind": "grad",
                         "cause": "compute", "max_abs": 1.19e-07, "max_ulp": 1}
    model["runs"]["B"]["final_sha256"] = "e" * 64
    model.pop("golden", None)
    summarise(failed)

    files = {"recorded": recorded, "compared": compared,
             "drifted": write_shard(work / "edited", "cuda12.6-torch2.7", drifted),
             "failed": write_shard(work / "edited", "cuda12.4-torch2.5", failed)}
    _CACHE["files"] = files
    return files


def edit(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out.update(changes)
    out["run_id"] = f"{out['run_id']}-{changes.get('image', {}).get('name', 'edited')}"
    return out


def summarise(doc: dict[str, Any]) -> None:
    """Count an edited shard's verdicts. Its exit code is left out on purpose: ``merge``
    must compute it from the verdicts, as ``run`` did."""
    vs = [m["verdict"] for m in doc["models"]]
    doc["summary"] = {**doc["summary"], "verdicts": {v: vs.count(v) for v in sorted(set(vs))}, "exit_code": None}


def write_shard(root: Path, name: str, doc: dict[str, Any]) -> Path:
    path = root / name / doc["run_id"] / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def artifact_layout(dest: Path, files: dict[str, Path], *names: str) -> Path:
    """Lay shards out as actions/download-artifact does: shards/<artifact>/<run_id>/results.json."""
    for name in names:
        src = files[name]
        doc = json.loads(src.read_text())
        target = dest / f"reproci-shard-{doc['image']['name']}" / src.parent.name
        shutil.copytree(src.parent, target)
        shutil.copy(src, target.parent / "latest.json")
    return dest


# --- the wheel ---

WHEEL_SOURCES = ("pyproject.toml", "README.md", "reproci", "docker")


def build_wheel(dest: Path) -> Path:
    """The wheel pip builds from a copy of the sources in ``dest`` (the checkout is left as it is)."""
    src = dest / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".cache"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = dest / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, text=True, timeout=600)
    (built,) = out.glob("reproci-*.whl")
    return built


# --- workflows ---

def load(name: str) -> dict[str, Any]:
    return yaml.safe_load(FILES[name].read_text())


def triggers(doc: dict[str, Any]) -> dict[str, Any]:
    return doc.get("on", doc.get(True))  # PyYAML reads the bare key `on` as True


def steps(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job_id, step) for job_id, job in doc["jobs"].items() for step in job.get("steps", [])]


def step_named(doc: dict[str, Any], job: str, name: str) -> dict[str, Any]:
    return next(s for s in doc["jobs"][job]["steps"] if s.get("name") == name)


def run_step(step: dict[str, Any], env: dict[str, str], cwd: Path, bin_dir: Path,
             scratch: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run a step's script the way GitHub's bash shell does, in ``cwd``, with the runner's
    files ($GITHUB_OUTPUT, $RUNNER_TEMP, $HOME) in ``scratch``; return it and its outputs."""
    output = scratch / "github_output"
    output.write_text("")
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "HOME": str(scratch),
                "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(scratch), "COLUMNS": "200", **env}
    out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=cwd,
                         env=full_env, capture_output=True, text=True, timeout=300)
    values = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return out, values


# --- writes that fail half-way ---

@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Within the block no file of this process grows past ``limit`` bytes: a write that passes
    it fails half-way with EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored), whatever wrote it, as a full
    disk fails a writer part of the way through a file."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
