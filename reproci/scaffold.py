"""``reproci init``: set a user's git repository up for reproci in one command.

It writes ``reproci.yaml``, a plugin for the user's model from one adapter's template (a
working tiny model, with the three questions a user must answer marked ``TODO(reproci)``),
``goldens/`` and two workflows that call reproci's reusable workflows, pinned to the installed
release. It never overwrites a file unless asked (``force``), and then writes every file or
none. The templates are package data (``reproci/templates/``) in ``string.Template`` form:
``$name`` is filled in, ``$$`` is a literal ``$`` (GitHub's ``${{ }}`` is written ``$${{ }}``).
The click command is in ``commands/init.py``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from . import __version__, atomic, images
from .cluster import github_matrix
from .errors import ConfigError, UsageError
from .golden.advice import update_command
from .settings.models import resolve
from .settings.options import RunOptions

REPOSITORY = "reproci/reproci"  # where reproci and its reusable workflows live: github.com/OWNER/NAME
ADAPTERS = {"plain": "plugin_plain.py", "hf": "plugin_hf.py", "lightning": "plugin_lightning.py",
            "script": None}  # script: no plugin; reproci.yaml names the team's own training script
EXTRAS = {"plain": "", "hf": "[hf]", "lightning": "[lightning]", "script": ""}  # what the runner's reproci needs for the adapter
WORKFLOWS = Path(".github", "workflows")
NEXT_WHY = ("the first run: NEW, no golden yet", "record the golden the next runs compare with", "commit them")
IGNORES = {  # what init has git ignore: path -> (its comment, its rules)
    Path(".gitignore"): ("# reproci: each run's results (uploaded by the workflows, never committed)", ("/results/",)),
    Path("goldens", ".gitignore"): ("# reproci: the lock that serialises golden updates, a write's temporary file",
                                    (".*.lock", ".*.tmp")),
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # an image name or runner label that YAML and JSON take as is


@dataclass(frozen=True, kw_only=True)
class InitOptions:
    directory: Path  # the top level of the user's git work tree: everything is written under it
    adapter: str = "plain"  # which template the plugin comes from: plain, hf or lightning
    image: str | None = None  # a manifest image the runs train in; None: the local backend
    runner_labels: tuple[str, ...] = github_matrix.DEFAULT_RUNNER_LABELS
    model_name: str = "model"  # an identifier: the plugin is reproci_<model_name>.py
    force: bool = False  # overwrite files that exist

    @property
    def plugin(self) -> str:
        return f"reproci_{self.model_name}.py"

    @property
    def image_name(self) -> str:
        return self.image or github_matrix.LOCAL


def identifier(text: str) -> str:
    """``text`` as a Python identifier (a repository folder's name as a model name): runs of
    other characters become one ``_``, lower case, never a leading digit; empty: ``model``."""
    name = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    if not name:
        return "model"
    return f"m_{name}" if name[0].isdigit() else name


def repository(directory: Path | None) -> Path:
    """The repository init sets up: ``directory`` (``--dir``), which must be the top level of a
    git work tree (GitHub reads workflows there only), else the one around the working directory."""
    top = git_top_level(directory or Path.cwd())
    if directory is not None and directory.resolve() != top:
        raise UsageError(f"--dir {directory} is inside the git repository {top}, whose top level holds "
                         f".github/workflows: pass --dir {top}")
    return top


def git_top_level(path: Path) -> Path:
    """The top level of the git work tree ``path`` is in; refused (exit 2) outside one."""
    if not path.is_dir():
        raise UsageError(f"--dir {path} is not a directory; name your repository's folder")
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True,
                             timeout=30)
    except FileNotFoundError as e:
        raise UsageError("reproci init sets up a git repository, and git is not installed; install git, "
                         "then run `git init` and `reproci init`") from e
    if out.returncode != 0 or not out.stdout.strip():
        raise UsageError(f"{path.resolve()} is not in a git repository: reproci init writes workflows for one; "
                         "run `git init` first")
    return Path(out.stdout.strip()).resolve()


def default_branch(top: Path) -> str:
    """The branch pushes to which the nightly workflow checks: the remote's default branch,
    else the one checked out, else ``main``."""
    for args in (["rev-parse", "--abbrev-ref", "origin/HEAD"], ["symbolic-ref", "--short", "HEAD"]):
        out = subprocess.run(["git", *args], cwd=top, capture_output=True, text=True, timeout=30)
        branch = out.stdout.strip().removeprefix("origin/")
        if out.returncode == 0 and branch and branch != "HEAD":
            return branch
    return "main"


def check(options: InitOptions) -> None:
    """Refuse, before anything is written, what the workflows could not use."""
    if options.adapter not in ADAPTERS:
        raise UsageError(f"--adapter {options.adapter!r} is not one of {', '.join(ADAPTERS)}")
    if not options.model_name.isidentifier():
        raise UsageError(f"--model-name {options.model_name!r} is not an identifier; try {identifier(options.model_name)}")
    bad = [label for label in options.runner_labels if not _NAME.match(label)]
    if not options.runner_labels or bad:
        raise UsageError(f"--runner-labels: {', '.join(bad) or '(none)'}: give labels of letters, digits, . _ and -, "
                         "comma-separated, e.g. self-hosted,linux,x64,gpu")
    if options.image is not None:
        manifest = _manifest(options)
        known = images.entries(manifest)
        if options.image not in known:
            raise ConfigError(f"--image {options.image} is not in {manifest} (known: "
                              f"{', '.join(known)}); the workflows build images of the manifest: name one, "
                              "or leave --image out for the local backend")


def _manifest(options: InitOptions) -> Path:
    """The manifest the repository's workflows will read: its own, else the one reproci ships."""
    own = options.directory / images.MANIFEST
    return own if own.is_file() else images.default_manifest()


def _template(name: str) -> Template:
    return Template((resources.files("reproci") / "templates" / f"{name}.tmpl").read_text(encoding="utf-8"))


def files(options: InitOptions, branch: str = "main") -> dict[Path, str]:
    """What init writes: path (relative to the repository) -> text."""
    values = {"repository": REPOSITORY, "version": __version__, "model": options.model_name,
              "plugin": options.plugin, "images": options.image_name, "image": options.image_name,
              "branch": branch, "runner_labels": json.dumps(list(options.runner_labels)),
              "requirement": f"reproci{EXTRAS[options.adapter]}=={__version__}",
              "image_line": (f"image: {options.image} # every run trains in a container of this manifest image"
                             if options.image else
                             "# image: cpu-torch2.13 # train in containers of a manifest image (reproci images list)")}
    plugin = ADAPTERS[options.adapter]
    made = ({Path("reproci.yaml"): _template("reproci.yaml").substitute(values),
             Path(options.plugin): _template(plugin).substitute(values)} if plugin is not None
            else {Path("reproci.yaml"): _template("reproci_script.yaml").substitute(values)})
    return {**made,
            Path("goldens", "README.md"): _template("goldens-README.md").substitute(values),
            WORKFLOWS / "reproci.yml": _template("reproci.yml").substitute(values),
            WORKFLOWS / "golden-update.yml": _template("golden-update.yml").substitute(values)}


def existing(options: InitOptions, paths: list[Path]) -> list[Path]:
    return [p for p in paths if (options.directory / p).exists()]


def ignores(options: InitOptions) -> dict[Path, str]:
    """The ignore rules init adds, so that ``git add`` takes only what belongs in a repository:
    path -> the lines to append, those of ``IGNORES`` the file lacks (a user's lines are kept)."""
    added = {}
    for path, (why, rules) in IGNORES.items():
        target = options.directory / path
        have = {line.strip() for line in target.read_text(errors="replace").splitlines()} if target.is_file() else set()
        missing = [rule for rule in rules if rule not in have]
        if missing:
            added[path] = "\n".join([why, *missing]) + "\n"
    return added


def write(options: InitOptions, planned: dict[Path, str], appended: dict[Path, str] | None = None) -> list[Path]:
    """Write every planned file atomically and append the ignore rules, or none: files that
    exist are refused (exit 2) unless ``force``, and so is a path that cannot take a file (a
    file where a folder goes, a read-only folder), before anything is created; a write that
    fails removes what this call created, folders included, and restores what it appended to."""
    appended = appended or {}
    there = existing(options, list(planned))
    if there and not options.force:
        raise UsageError(f"{', '.join(map(str, there))} already exist{'s' if len(there) == 1 else ''} in "
                         f"{options.directory}; nothing was written: --force overwrites them")
    targets = [options.directory / p for p in [*planned, *appended]]
    for target in targets:
        why = atomic.why_unwritable(target)
        if why is not None:
            raise UsageError(f"reproci init writes {target}, and {why}; nothing was written: move it aside or "
                             "make it writable, then run init again")
    new_folders = sorted({d for t in targets for d in t.parents if not d.exists()}, key=lambda d: -len(d.parts))
    created: list[Path] = []
    before: dict[Path, bytes] = {}
    target = options.directory
    try:
        for path, text in planned.items():
            target = options.directory / path
            new = not target.exists()
            atomic.write_text(target, text)
            if new:
                created.append(target)
        for path, text in appended.items():
            target = options.directory / path
            if target.exists():
                before[target] = target.read_bytes()
            else:
                created.append(target)
            atomic.append_text(target, text)
    except BaseException as e:
        for done in created:
            done.unlink(missing_ok=True)
        for done, data in before.items():
            atomic.write_bytes(done, data)
        for folder in new_folders:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        if isinstance(e, OSError) and atomic.is_unwritable(e):
            raise UsageError(f"reproci init could not write {target} ({e.strerror or e}); nothing was written: "
                             "make it writable, then run init again") from e
        raise
    return list(planned)


def next_commands(options: InitOptions) -> list[str]:
    """The three commands to run next, from the repository's top level: the first run (NEW),
    the golden update exactly as that run will advise it, and the commit."""
    if ADAPTERS[options.adapter] is None:  # the script's commands are reproci.yaml's: the commands need no flags
        add = shlex.join(["git", "add", ".gitignore", "reproci.yaml", "goldens", ".github"])
        image = ["--image", options.image] if options.image else []
        first = "reproci run" if options.image is None else f"reproci images build {options.image} && reproci run"
        return [first, shlex.join(["reproci", "golden", "update", *(image or ["--image", "local"])]),
                f'{add} && git commit -m "Check the training script\'s reproducibility with reproci"']
    model = resolve(f"{options.directory / options.plugin}:build")
    entry = images.resolve(options.image, _manifest(options))[1] if options.image else None
    run_options = RunOptions(models=(model,), image=options.image, image_entry=entry, image_name=options.image_name,
                             cpu_isa=entry.cpu_isa if entry else None, project_root=options.directory)
    first = "reproci run" if options.image is None else f"reproci images build {options.image} && reproci run"
    add = shlex.join(["git", "add", ".gitignore", "reproci.yaml", "goldens", ".github", options.plugin])
    return [first, update_command(run_options), f'{add} && git commit -m "Check the model\'s reproducibility with reproci"']
