"""reproci.yaml: the keys a user may set (the flags of ``reproci run``, with underscores, as
``settings.declared`` declares them) and what each takes, checked in one place before any
value is used; and ``Settings``, a command-line value over the file's over a default."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from .. import safe_yaml
from ..errors import ConfigError
from .declared import Catalog

CONFIG_FILE = "reproci.yaml"


def find_config(start: Path | None = None) -> Path | None:
    """The reproci.yaml a command run in ``start`` (the working directory) reads: the one there,
    else the nearest in a folder above, searched as git searches for its repository: up to the
    top level of the work tree (a folder holding ``.git``), never into a folder of
    ``GIT_CEILING_DIRECTORIES``, at most to the filesystem root. None: there is none. The path
    is relative to ``start`` (``reproci.yaml``, ``../reproci.yaml``), as a message shows it."""
    here = (start or Path.cwd()).absolute()
    ceilings = {Path(p).absolute() for p in os.environ.get("GIT_CEILING_DIRECTORIES", "").split(os.pathsep) if p}
    for folder in (here, *here.parents):
        if (folder / CONFIG_FILE).is_file():
            return Path(os.path.relpath(folder / CONFIG_FILE, here))
        if (folder / ".git").exists() or folder.parent in ceilings:
            return None
    return None


def load_config(path: Path | None, catalog: Catalog) -> tuple[dict[str, Any], Path | None]:
    """The run section of reproci.yaml (an explicit path, else the one ``find_config`` finds),
    checked against the keys of ``catalog`` (the core options and the stages' own)."""
    if path is None:
        path = find_config()
        if path is None:
            return {}, None
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; drop --config or create it")
    try:
        data = safe_yaml.load(path, limit=safe_yaml.CONFIG_LIMIT) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: malformed YAML ({getattr(e, 'problem', e)}); fix the file") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a config file is YAML: fix the file") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of options at the top level")
    keys = catalog.config_keys()
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise ConfigError(f"{path}: unknown option(s) {', '.join(map(str, unknown))}; "
                          f"known: {', '.join(sorted(keys))}")
    for key, value in data.items():
        expected, ok = keys[key]
        if value is not None and not ok(value):
            raise ConfigError(f"{path}: {key}: expected {expected}, got {value!r}; fix the file")
    for o in catalog.options():
        for alias in o.aliases:
            if alias in data and o.name not in data:
                data[o.name] = data.pop(alias)
    return data, path


class Settings:
    """A run's settings: a command-line value (None or (): not given) over the config file's
    over a default; and where each came from, so that an error names it as the user wrote it."""

    def __init__(self, cli: Mapping[str, Any], config: Mapping[str, Any], path: Path | None, catalog: Catalog) -> None:
        self.cli, self.config, self.path, self.catalog = cli, config, path, catalog
        # a reproci.yaml found above the working directory (not named by --config): the folder
        # its relative paths, and the results and goldens folders by default, are beside
        self.root = path.parent if path is not None and cli.get("config") is None and path.parent != Path(".") else None

    @classmethod
    def read(cls, cli: Mapping[str, Any], catalog: Catalog) -> Settings:
        """The settings of a command line: its reproci.yaml (``--config``, else the one found) read, once."""
        config, path = load_config(cli.get("config"), catalog)
        return cls(cli, config, path, catalog)

    def _param(self, name: str) -> str:
        """The click parameter that holds the command line's value of the option ``name``."""
        return next((o.key for o in self.catalog.table if o.name == name), name)

    def folder(self, name: str, default: str) -> Path:
        """A folder setting (``results_dir``, ``goldens_dir``): the command line's as given, else
        the config file's or the default, beside a reproci.yaml found above the working directory."""
        value = Path(self(name, default))
        return value if self.given(name) or self.root is None or value.is_absolute() else self.root / value

    def beside(self, model: str) -> str:
        """A model the config file names as ``FILE.py:factory``, its file beside a reproci.yaml
        found above the working directory; any other as written."""
        target, sep, factory = model.rpartition(":")
        if self.root is None or not sep or not target.endswith(".py") or Path(target).expanduser().is_absolute():
            return model
        return f"{self.root / target}:{factory}"

    def given(self, name: str) -> bool:
        """Whether the command line gave ``name``."""
        v = self.cli.get(self._param(name))
        return v is not None and v != ()

    def __call__(self, name: str, default: Any) -> Any:
        if self.given(name):
            return self.cli[self._param(name)]
        v = self.config.get(name)
        return default if v is None else v  # `steps:` with no value: as if not set

    def from_file(self, name: str) -> str:
        """'reproci.yaml: ' when the config file set ``name`` (and the command line did not), else ''."""
        return f"{self.path or CONFIG_FILE}: " if not self.given(name) and self.config.get(name) is not None else ""

    def said(self, name: str) -> str:
        """The setting as the user wrote it: '--compile-mode' from the command line (or when
        not set at all), 'reproci.yaml: compile_mode' from the config file."""
        if self.from_file(name):
            return f"{self.from_file(name)}{name}"
        return next((o.shown for o in self.catalog.table if o.name == name), "--" + name.replace("_", "-"))
