"""A section of results.json (or of a golden) as a frozen dataclass, read by attribute and written
as the same JSON it has always been: ``load(Kind, data)`` and ``dump(value)``.

A section's dataclass lists its keys in the order the JSON has them; a field's type says what
its value is (another section, ``list[...]``, ``dict[str, ...]``, ``X | None``, a plain value).
What the JSON leaves out, a freshly made section leaves out where the field says so
(``key(omit_none=True)``: the key is written only when the value is not None), and a section read
back writes exactly the keys it was read with, so that a document re-rendered, merged or
re-written is the same bytes. A key the JSON spells otherwise than a field can (``from``) is the
field's ``key(name=...)``. Keys a section does not declare (a newer reproci's) are kept as read.

    @dataclass(frozen=True, kw_only=True)
    class Probes:
        rows: list[ProbeRow] = dataclasses.field(default_factory=list)
        depends: list[str] = dataclasses.field(default_factory=list)
        seconds: float = 0.0

    probes = typed.load(Probes, entry["probes"])      # attribute access, checked by mypy
    entry["probes"] = typed.dump(probes)              # the same JSON
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar, Union

T = TypeVar("T")
S = TypeVar("S", bound="Section")
META = "reproci.typed"
# What a section read back remembers, beside its fields: the keys it was read with, in their order,
# and the keys it does not declare (as read). Not fields: a section made fresh has neither.
_READ = "_typed_read"


def key(*, name: str | None = None, omit_none: bool = False, default: Any = dataclasses.MISSING,
        default_factory: Any = dataclasses.MISSING) -> Any:
    """A field whose JSON key is ``name`` (where it is not the field's), or that is left out of the
    JSON where its value is None (``omit_none``)."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={META: {"name": name, "omit_none": omit_none}})


def json_name(f: dataclasses.Field[Any]) -> str:
    """A field's key in the JSON."""
    return f.metadata.get(META, {}).get("name") or f.name


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def load(kind: type[T], data: Any, *, lenient: bool = False) -> T:
    """``data`` (a section's JSON, as read) as a ``kind``; a key it lacks is the field's default.
    ``lenient`` (a reader's view, never written back): a null where the field's type admits none is
    the field's default too, at any depth, as ``(entry.get("runs") or {})`` reads it."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{kind.__name__}: expected a mapping, got {type(data).__name__}")
    hints, values, declared = _hints(kind), {}, set()  # type: ignore[arg-type]
    for f in dataclasses.fields(kind):  # type: ignore[arg-type]
        name = json_name(f)
        declared.add(name)
        if name in data and not (lenient and data[name] is None and not _admits_none(hints[f.name])):
            values[f.name] = _value(hints[f.name], data[name], lenient)
    made = kind(**values)
    object.__setattr__(made, _READ, (tuple(data), {k: v for k, v in data.items() if k not in declared}))
    return made


def _admits_none(hint: Any) -> bool:
    return hint is Any or (typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(hint))


def _value(hint: Any, value: Any, lenient: bool = False) -> Any:
    """``value`` as the type ``hint`` says: a section made of its mapping, the items of a list or
    a dict each so; any other value as it is (the JSON's own types are the fields' types)."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        sections = [a for a in kinds if dataclasses.is_dataclass(a)]
        if len(kinds) == 1 and not sections:  # list[X] | None, dict[str, X] | None: read as the list or dict
            return _value(kinds[0], value, lenient)
        if sections and isinstance(value, Mapping):
            return _value(sections[0], value, lenient)
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return load(hint, value, lenient=lenient)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint) or (Any,)
        return [_value(item, v, lenient) for v in value]
    if origin is dict and isinstance(value, Mapping):
        item = (typing.get_args(hint) or (Any, Any))[1]
        return {k: _value(item, v, lenient) for k, v in value.items()}
    return value


def dump(value: Any) -> Any:
    """A section (or a list or dict of them, or a plain value) as its JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _section(value)
    if isinstance(value, list):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return value


def _section(value: Any) -> dict[str, Any]:
    by_name = {json_name(f): f for f in dataclasses.fields(value)}
    read = getattr(value, _READ, None)
    if read is not None:  # the keys it was read with, in their order, its own values for those it declares
        order, extra = read
        present = [*order, *(n for n, f in by_name.items() if n not in order and getattr(value, f.name) is not None
                             and not _default(f, getattr(value, f.name)))]
        return {n: dump(getattr(value, by_name[n].name)) if n in by_name else extra[n] for n in present}
    return {n: dump(getattr(value, f.name)) for n, f in by_name.items()
            if not (f.metadata.get(META, {}).get("omit_none") and getattr(value, f.name) is None)}


def _default(f: dataclasses.Field[Any], value: Any) -> bool:
    """Whether a field not read holds its default still (so a section read back keeps its keys)."""
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


def replace(value: T, **changes: Any) -> T:
    """``dataclasses.replace`` that keeps what a section read back remembers (its keys): a key
    added by the change comes after them, as a dict's new key does."""
    made = dataclasses.replace(value, **changes)  # type: ignore[type-var]
    read = getattr(value, _READ, None)
    if read is not None:
        object.__setattr__(made, _READ, read)
    return made


class Section:
    """A section's ``to_json``/``from_json``, for the dataclass that subclasses it (a stage's result)."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = dump(self)
        return data

    @classmethod
    def from_json(cls: type[S], data: Mapping[str, Any]) -> S:
        return load(cls, data)


@dataclass(frozen=True, kw_only=True)
class Error:
    """Why a stage's work for a model failed (a worker's failure): its section's ``error``."""

    kind: str  # errors.py's kind of failure
    message: str
