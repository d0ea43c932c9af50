"""The golden store: one reviewable YAML file per image under ``goldens/``.

``goldens/NAME.yaml`` holds the image identity, the environment fingerprint and package
versions inside the image, when and from which commit it was recorded, and per model its
identity (code and config hashes), steps, seed, final sha256 and loss trajectory. The
per-step checksums (enough to bisect a new run against the golden without re-running the
old image) and the final state tensors (for magnitudes) live in a compressed sidecar,
``goldens/NAME.<sha12>.npz``, whose name carries its content hash.

Writes are atomic and ordered so that an interrupted update leaves the previous golden
intact: the new sidecar is written under a new name, then the YAML is replaced by rename,
then the old sidecar is removed. Updates of one image are serialised by a lock file;
different images never touch each other's files. ``write`` records one run's models;
``write_combined`` the goldens that the cells of ``--backend ray`` or ``slurm`` recorded
apart, on their nodes, as one file written by the driver.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Iterator, Mapping, TypedDict, cast

import numpy as np
import yaml

from .. import __version__, atomic, safe_yaml, typed
from ..document import Document, Entry, ImageView
from ..errors import GoldenError
from ..results import Image, ModelEntry, ResultsDocument
from ..worker.run_record import Run, Trajectory
from .environment import HOST_KEYS, TOOLCHAIN_KEYS, diff_keys
from .folder import golden_path

if TYPE_CHECKING:
    import torch

    from ..stages.base import Stages
    from ..worker.sections import Environment, Execution

FORMAT_VERSION = 1
STATE_CAP_BYTES = 16 * 1024 * 1024  # final parameters/buffers above this are not kept (GPU-sized models)
INTACT = "; the previous golden is intact"
IDENTITY_KEYS = ("code_sha256", "config_sha256", "steps", "seed", "profile", "device", "execution")
# Per-op hashes of a model's first steps: step -> (op overloads, short output hashes) (stages/determinism/golden_ops.py)
OpHashes = dict[int, tuple[list[str], list[str]]]


class Recorded(TypedDict):
    """When, from which commit and by which reproci a golden file was recorded."""

    at: str
    project_commit: str | None
    reproci_version: str
    run_id: str | None


class Sidecar(TypedDict):
    """The arrays file beside the YAML: its name and its content hash."""

    file: str
    sha256: str


class GoldenData(TypedDict):
    """A golden YAML file as ``write`` writes it: the image, the recording, the environment
    fingerprint and package versions (as the results document has them), the sidecar, and per
    model its entry (the keys of ``GoldenEntry``, then each stage's summary under its name)."""

    version: int
    image: Image | None
    recorded: Recorded
    environment: Environment | None
    packages: dict[str, str] | None
    sidecar: Sidecar
    models: dict[str, dict[str, Any]]


class GoldenEntry(TypedDict):
    """A model's entry as ``write`` records it, before the stages' summaries."""

    ref: str | None
    code_sha256: str | None
    config_sha256: str | None
    config: Any  # the plugin's config: whatever its factory returned
    profile: str
    device: str
    steps: int | None
    resume_at: int | None
    seed: int | None
    threads: int
    world_size: int
    execution: Execution | None
    final_sha256: str | None
    batch_checksum: str | None
    fingerprint_scheme: str | None
    losses: list[float | str]  # a loss that is not a number (nan, inf) as its text
    run_id: str | None
    recorded_at: str


@dataclass(frozen=True, kw_only=True)
class EntryView:
    """A model's golden entry read by attribute; a key an older or hand-edited file lacks (or
    holds null) is the field's default. The stages' summaries are read from ``ModelGolden.entry``."""

    ref: str | None = None
    code_sha256: str | None = None
    config_sha256: str | None = None
    profile: str | None = None
    device: str | None = None
    steps: int | None = None
    resume_at: int | None = None
    seed: int | None = None
    threads: int | None = None
    world_size: int | None = None
    final_sha256: str | None = None
    batch_checksum: str | None = None
    fingerprint_scheme: str | None = None
    losses: list[Any] = field(default_factory=list)  # floats, or the text of a loss that is not a number
    run_id: str | None = None
    recorded_at: str | None = None


@dataclass(frozen=True, kw_only=True)
class Identity:
    """What identifies a model and the settings of its run (``IDENTITY_KEYS``): a run with another
    identity is another run, not comparable with the golden."""

    code_sha256: str | None = None
    config_sha256: str | None = None
    steps: int | None = None
    seed: int | None = None
    profile: str | None = None
    device: str | None = None
    execution: Execution | None = None  # compiled, autocast (worker.execution)

    def diff(self, other: Identity) -> dict[str, list[Any]]:
        """Each key where the two differ, in ``IDENTITY_KEYS`` order: key -> [this one's, the other's]."""
        pairs = {"code_sha256": (self.code_sha256, other.code_sha256),
                 "config_sha256": (self.config_sha256, other.config_sha256),
                 "steps": (self.steps, other.steps), "seed": (self.seed, other.seed),
                 "profile": (self.profile, other.profile), "device": (self.device, other.device),
                 "execution": (self.execution, other.execution)}
        return {k: [mine, theirs] for k, (mine, theirs) in pairs.items() if mine != theirs}


@dataclass(frozen=True, kw_only=True)
class RecordedView:
    """The file's ``recorded`` read by attribute."""

    at: str | None = None
    project_commit: str | None = None
    reproci_version: str | None = None
    run_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class SidecarView:
    """The file's ``sidecar`` read by attribute."""

    file: str | None = None
    sha256: str | None = None


@dataclass(frozen=True, kw_only=True)
class FileView:
    """A golden file's own sections read by attribute (``GoldenData``); its models are ``Golden.models``."""

    version: int | None = None
    image: ImageView = field(default_factory=ImageView)
    recorded: RecordedView = field(default_factory=RecordedView)
    packages: dict[str, str] | None = None
    sidecar: SidecarView | None = None


@dataclass
class ModelGolden:
    name: str
    entry: dict[str, Any]  # the YAML mapping for this model: ``GoldenEntry``'s keys and the stages' summaries
    names: list[str] = field(default_factory=list)  # tensor names of the per-step rows
    fingerprints: np.ndarray | None = None  # (steps, tensors) int64
    batch_fingerprints: np.ndarray | None = None
    state: dict[str, np.ndarray] = field(default_factory=dict)  # final state, "kind:name" -> array
    tensor_sha256: dict[str, str] = field(default_factory=dict)  # final sha256 per tensor
    ops: OpHashes = field(default_factory=dict)  # per-op hashes of the first steps

    @cached_property
    def view(self) -> EntryView:
        """The entry read by attribute."""
        return typed.load(EntryView, self.entry, lenient=True)

    @property
    def identity(self) -> Identity:
        """What identifies the model and the settings of its recorded run."""
        e = self.view
        return Identity(code_sha256=e.code_sha256, config_sha256=e.config_sha256, steps=e.steps, seed=e.seed,
                        profile=e.profile, device=e.device, execution=self.entry.get("execution"))

    def as_record(self) -> Trajectory:
        """The golden's run as the comparisons read a run record (``golden.divergence``)."""
        e = self.view
        return Trajectory(
            tensor_names=list(self.names),
            fingerprints=self.fingerprints.tolist() if self.fingerprints is not None else [],
            batch_fingerprints=self.batch_fingerprints.tolist() if self.batch_fingerprints is not None else [],
            batch_checksum=e.batch_checksum,  # the scheme: same scheme, comparable batches
            fingerprint_scheme=e.fingerprint_scheme,  # what the rows hold for an absent tensor
            losses=e.losses,
            final_sha256=e.final_sha256,
            tensor_sha256=self.tensor_sha256,  # from step 0
        )


@dataclass
class Golden:
    path: Path
    data: GoldenData  # the whole YAML document (a hand-edited file may lack a section)
    models: dict[str, ModelGolden]

    @cached_property
    def file(self) -> FileView:
        """The file's own sections read by attribute."""
        return typed.load(FileView, self.data, lenient=True)

    @property
    def image(self) -> Image:
        """The image section as the file holds it."""
        return self.data.get("image") or {}

    @property
    def environment(self) -> Environment | None:
        """The environment fingerprint as the file holds it (compared key by key, ``golden.environment``)."""
        return self.data.get("environment")


def path_for(goldens_dir: Path, image_name: str) -> Path:
    if not image_name or "/" in image_name or image_name.startswith("."):
        raise GoldenError(f"invalid golden name {image_name!r}: use the image name without slashes")
    return golden_path(goldens_dir, image_name)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """What the YAML reader refused, on one line: 'character #x0000 at byte 0: special characters
    are not allowed' (a reader's own message spans two lines)."""
    if isinstance(e, yaml.reader.ReaderError):
        char = e.character if isinstance(e.character, int) else ord(e.character)
        return f"character #x{char:04x} at {'byte' if isinstance(e.character, int) else 'character'} {e.position}: {e.reason}"
    return " ".join(str(getattr(e, "problem", None) or e).split())


def repository_of(goldens_dir: Path) -> Path:
    """The folder the paths in a golden are relative to: the git work tree that holds the goldens
    folder, else the folder that holds it (beside reproci.yaml, where the goldens folder is by default)."""
    folder = goldens_dir.resolve()
    return next((f for f in (folder, *folder.parents) if (f / ".git").exists()), folder.parent)


def relative_ref(ref: str | None, repository: Path) -> str | None:
    """A model's reference as a committed golden records it: a plugin's ``FILE.py:factory`` with
    FILE relative to the repository, so that the file names no machine. A file outside the
    repository stays absolute: no checkout of the repository holds it. Any other reference (a
    registry name, module:factory, a script's command) as it is; an older golden's absolute
    path is read as any other text."""
    target, sep, factory = (ref or "").rpartition(":")
    if not sep or not target.endswith(".py") or not Path(target).is_absolute():
        return ref
    path = Path(target)
    return f"{path.relative_to(repository).as_posix()}:{factory}" if path.is_relative_to(repository) else ref


def _fail(path: Path, key: str, what: str) -> GoldenError:
    return GoldenError(f"{path}: key {key}: {what}; fix the file or re-record with `reproci golden update --image {path.stem}`")


def load(goldens_dir: Path, image_name: str) -> Golden | None:
    """The golden for an image, or None if there is none. Corrupt files raise GoldenError."""
    path = path_for(goldens_dir, image_name)
    if not path.exists():
        return None
    try:
        data = safe_yaml.load(path, limit=safe_yaml.GOLDEN_LIMIT)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise GoldenError(f"{path}{where}: not valid YAML ({_yaml_problem(e)}); restore it from git "
                          f"or re-record with `reproci golden update --image {image_name}`") from e
    except UnicodeDecodeError as e:
        raise GoldenError(f"{path}: unreadable golden (not UTF-8 text, byte {e.start}); restore it from git or "
                          f"re-record with `reproci golden update --image {image_name}`") from e
    except OSError as e:
        raise GoldenError(f"cannot read {path}: {e.strerror}") from e
    if not isinstance(data, dict):
        raise _fail(path, "(top level)", "expected a mapping")
    version = data.get("version")
    if version != FORMAT_VERSION:
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise GoldenError(f"{path}: golden format version {version} is newer than this reproci reads "
                              f"({FORMAT_VERSION}); upgrade reproci")
        raise GoldenError(f"{path}: golden format version {version!r} is not {FORMAT_VERSION}; "
                          f"re-record it with `reproci golden update --image {image_name}`")
    models_data = data.get("models")
    if not isinstance(models_data, dict):
        raise _fail(path, "models", "expected a mapping of model name to golden")
    for name, entry in models_data.items():
        if not isinstance(entry, dict):
            raise _fail(path, f"models.{name}", "expected a mapping")
        digest = entry.get("final_sha256")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise _fail(path, f"models.{name}.final_sha256", "expected a 64-character hex sha256")
        if not isinstance(entry.get("steps"), int):
            raise _fail(path, f"models.{name}.steps", "expected an integer")
    models = {name: ModelGolden(name=name, entry=entry) for name, entry in models_data.items()}
    sidecar = data.get("sidecar")
    if sidecar:
        _load_sidecar(path, sidecar, models)
    return Golden(path=path, data=cast(GoldenData, data), models=models)  # its version and models checked above


def _load_sidecar(path: Path, sidecar: Any, models: dict[str, ModelGolden]) -> None:
    if not isinstance(sidecar, dict) or not isinstance(sidecar.get("file"), str):
        raise _fail(path, "sidecar", "expected {file, sha256}")
    side = path.parent / sidecar["file"]
    try:
        raw = side.read_bytes()
    except OSError:
        raise _fail(path, "sidecar.file", f"{side.name} is missing") from None
    if hashlib.sha256(raw).hexdigest() != sidecar.get("sha256"):
        raise _fail(path, "sidecar.sha256", f"{side.name} does not match its recorded hash")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            for key in npz.files:
                model, _, rest = key.partition("/")
                if model not in models:
                    continue
                g = models[model]
                if rest == "names":
                    g.names = [str(x) for x in npz[key].tolist()]
                elif rest == "fingerprints":
                    g.fingerprints = npz[key]
                elif rest == "batch":
                    g.batch_fingerprints = npz[key]
                elif rest.startswith("state/"):
                    g.state[rest[6:]] = npz[key]
                elif rest.startswith("ops/") and rest.endswith("/overloads"):
                    step = int(rest.split("/")[1])
                    g.ops[step] = (npz[key].tolist(), npz[f"{model}/ops/{step}/digests"].tolist())
            for g in models.values():
                if f"{g.name}/sha_names" in npz.files:
                    g.tensor_sha256 = dict(zip(npz[f"{g.name}/sha_names"].tolist(), npz[f"{g.name}/sha"].tolist()))
    except (ValueError, OSError) as e:
        raise _fail(path, "sidecar.file", f"{side.name} is not a readable archive ({e})") from e


@contextlib.contextmanager
def locked(goldens_dir: Path, image_name: str) -> Iterator[None]:
    """Serialise updates of one image's golden (different images do not block each other)."""
    goldens_dir.mkdir(parents=True, exist_ok=True)
    lock = goldens_dir / f".{image_name}.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _state_arrays(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    import torch

    out: dict[str, np.ndarray] = {}
    total = 0
    for name, t in sorted(state.items()):
        if name.startswith(("grad:", "optim:")):
            continue  # parameters and buffers only: enough for magnitudes, and a third of the size
        t = t.detach().cpu()
        t = (t.to_dense() if t.layout != torch.strided else t).contiguous()
        arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        total += arr.nbytes
        if total > STATE_CAP_BYTES:
            return {}
        out[name] = arr
    return out


def write(goldens_dir: Path, image_name: str, document: ResultsDocument, records: Mapping[str, Run],
          states: dict[str, dict[str, torch.Tensor]], stages: Stages, *, replace_models: bool = False,
          ops: dict[str, OpHashes] | None = None) -> Path:
    """Record goldens for the models in ``records`` (run A of each) from a results document, with
    what each of ``stages`` keeps of its results (``Stage.golden_summary``).

    Entries for other models already in the file are kept when the environment is the
    same; when it differs, every model of the file must be re-recorded together.
    """
    path = path_for(goldens_dir, image_name)
    with locked(goldens_dir, image_name):
        try:
            old = load(goldens_dir, image_name)
        except GoldenError:
            old = None  # corrupt: replaced whole; its sidecars are orphans, removed below
        kept = {} if old is None or replace_models else _kept_models(old, records, document)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        arrays: dict[str, np.ndarray] = {}
        models_yaml: dict[str, dict[str, Any]] = {}
        for name, g in sorted(kept.items()):
            models_yaml[name] = g.entry
            _add_arrays(arrays, name, g.names, g.fingerprints, g.batch_fingerprints, g.state, g.tensor_sha256, g.ops)
        by_name = {m["model"]: m for m in document["models"]}
        repository = repository_of(goldens_dir)
        for name, run in sorted(records.items()):
            rec = Trajectory.of(run)
            models_yaml[name] = _model_entry(by_name[name], rec, document, now, repository, stages)
            fps = np.asarray(rec.fingerprints, dtype=np.int64)
            batch = np.asarray(rec.batch_fingerprints, dtype=np.int64)
            _add_arrays(arrays, name, rec.tensor_names, fps, batch, _state_arrays(states.get(name) or {}),
                        rec.tensor_sha256, (ops or {}).get(name) or {})
        _commit(goldens_dir, image_name, old, document, models_yaml, arrays, now)
    return path


def write_combined(goldens_dir: Path, image_name: str, document: ResultsDocument, parts: list[Golden]) -> Path:
    """Record the goldens that several cells recorded apart (``reproci run --backend ray``: one
    model each, on their nodes) as one file, as one run of them all would have: each model's
    entry and arrays as its cell recorded them, under this document's run id. Models of the old
    file that no cell re-recorded are kept on the same terms as ``write``."""
    path = path_for(goldens_dir, image_name)
    with locked(goldens_dir, image_name):
        try:
            old = load(goldens_dir, image_name)
        except GoldenError:
            old = None
        recorded = {name: g for part in parts for name, g in part.models.items()}
        kept = {} if old is None else _kept_models(old, dict.fromkeys(recorded), document)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        arrays: dict[str, np.ndarray] = {}
        models_yaml: dict[str, dict[str, Any]] = {}
        run_id = Document.of(document).run_id
        for name, g in sorted({**kept, **recorded}.items()):
            models_yaml[name] = {**g.entry, "run_id": run_id} if name in recorded else g.entry
            _add_arrays(arrays, name, g.names, g.fingerprints, g.batch_fingerprints, g.state, g.tensor_sha256, g.ops)
        _commit(goldens_dir, image_name, old, document, models_yaml, arrays, now)
    return path


def _kept_models(old: Golden, records: Collection[str], document: ResultsDocument) -> dict[str, ModelGolden]:
    """The models of the old file that this update keeps: those not re-recorded, which may
    only stay beside the new ones when image, packages and environment are the same."""
    doc = Document.of(document)
    same_env = (old.file.packages == doc.packages and old.file.image.digest == doc.image.digest
                and not diff_keys(old.environment, document.get("environment"), TOOLCHAIN_KEYS + HOST_KEYS))
    others = {n: g for n, g in old.models.items() if n not in records}
    if others and not same_env:
        raise GoldenError(
            f"{old.path}: the image or packages changed since {', '.join(sorted(others))} were recorded; "
            f"re-record every model together (run with all of {', '.join(sorted(set(old.models) | set(records)))})")
    return others


def _model_entry(m: ModelEntry, rec: Trajectory, document: ResultsDocument, now: str,
                 repository: Path, stages: Stages) -> dict[str, Any]:
    """One model's YAML mapping: its identity, settings, final hash and loss trajectory, then each
    stage's summary of its result under the stage's name, in the order they run."""
    opts, e = document["options"], Entry.of(m)
    entry: GoldenEntry = {
        "ref": relative_ref(e.ref, repository), "code_sha256": e.code_sha256, "config_sha256": e.config_sha256,
        "config": e.config, "profile": opts["profile"], "device": opts["device"], "steps": e.steps,
        "resume_at": e.resume_at, "seed": e.seed, "threads": opts["threads"],
        "world_size": opts.get("world_size", 1), "execution": m.get("execution"),
        "final_sha256": rec.final_sha256, "batch_checksum": rec.batch_checksum,
        "fingerprint_scheme": rec.fingerprint_scheme,
        "losses": [float(x) if isinstance(x, (int, float)) else str(x) for x in rec.losses],
        "run_id": Document.of(document).run_id, "recorded_at": now,
    }
    summaries = [(stage.name, stage.golden_summary(m)) for stage in stages]
    return {**entry, **{name: summary for name, summary in summaries if summary}}


def _commit(goldens_dir: Path, image_name: str, old: Golden | None, document: ResultsDocument,
            models_yaml: dict[str, dict[str, Any]], arrays: dict[str, np.ndarray], now: str) -> None:
    """Write in the order that keeps the previous golden intact until the last rename."""
    buf = io.BytesIO()
    # numpy's stub types **kwds against its keyword allow_pickle (bool); these keys are tensor names
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
    side_bytes = buf.getvalue()
    side_sha = hashlib.sha256(side_bytes).hexdigest()
    side_name = f"{image_name}.{side_sha[:12]}.npz"
    doc = Document.of(document)
    data: GoldenData = {
        "version": FORMAT_VERSION,
        "image": document.get("image"),
        "recorded": {"at": now, "project_commit": doc.project_commit, "reproci_version": __version__,
                     "run_id": doc.run_id},
        "environment": document.get("environment"),
        "packages": doc.packages,
        "sidecar": {"file": side_name, "sha256": side_sha},
        "models": models_yaml,
    }
    header = (f"# reproci golden hashes for image {image_name!r}. Reviewed like code: a change here means\n"
              f"# results changed. Re-record with `reproci golden update --image {image_name}`.\n")
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
    goldens_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(goldens_dir / side_name, side_bytes, on_full=INTACT)  # 1. the new sidecar, under a new name
    atomic.write_bytes(path_for(goldens_dir, image_name), text.encode(), on_full=INTACT)  # 2. the YAML points at it
    old_side = old.file.sidecar.file if old is not None and old.file.sidecar is not None else None
    for stale in goldens_dir.glob(f"{image_name}.*.npz"):  # 3. sidecars nothing points at
        if stale.name != side_name and (stale.name == old_side or _orphan(goldens_dir, image_name, stale)):
            stale.unlink(missing_ok=True)


def _orphan(goldens_dir: Path, image_name: str, side: Path) -> bool:
    stem = side.name[: -len(".npz")]
    return stem.rsplit(".", 1)[0] == image_name


def _add_arrays(arrays: dict[str, np.ndarray], name: str, names: list[str], fps: Any, batch: Any,
                state: dict[str, np.ndarray], tensor_sha256: dict[str, str], ops: OpHashes) -> None:
    arrays[f"{name}/sha_names"] = np.asarray(sorted(tensor_sha256), dtype=str)
    arrays[f"{name}/sha"] = np.asarray([tensor_sha256[k] for k in sorted(tensor_sha256)], dtype=str)
    arrays[f"{name}/names"] = np.asarray(names, dtype=str)
    arrays[f"{name}/fingerprints"] = np.asarray(fps if fps is not None else [], dtype=np.int64)
    arrays[f"{name}/batch"] = np.asarray(batch if batch is not None else [], dtype=np.int64)
    for t, arr in state.items():
        arrays[f"{name}/state/{t}"] = arr
    for step, (overloads, digests) in ops.items():
        arrays[f"{name}/ops/{step}/overloads"] = np.asarray(overloads, dtype=str)
        arrays[f"{name}/ops/{step}/digests"] = np.asarray(digests, dtype=str)
