"""A section of the results as a dataclass (``reproci.typed``): read by attribute, written as the
same JSON, keys in the same order, what was left out still left out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from reproci import typed


@dataclass(frozen=True, kw_only=True)
class Row:
    factor: str
    start: str | None = typed.key(name="from", default=None)
    note: str | None = typed.key(omit_none=True, default=None)


@dataclass(frozen=True, kw_only=True)
class Section:
    rows: list[Row] = field(default_factory=list)
    by_mode: dict[str, Row] = field(default_factory=dict)
    best: Row | None = None
    seconds: float = 0.0
    regression: str | None = typed.key(omit_none=True, default=None)


def test_a_section_made_fresh_leaves_out_what_it_says_and_spells_keys_as_the_json() -> None:
    made = Section(rows=[Row(factor="threads", start="4")], best=Row(factor="amp", note="fp16"), seconds=1.5)
    assert typed.dump(made) == {"rows": [{"factor": "threads", "from": "4"}], "by_mode": {},
                                "best": {"factor": "amp", "from": None, "note": "fp16"}, "seconds": 1.5}


def test_a_section_read_back_is_written_as_the_same_bytes() -> None:
    text = ('{"seconds": 2.0, "rows": [{"from": "on", "factor": "compile", "note": null}], '
            '"newer": {"kept": [1, 2]}, "best": null}')
    section = typed.load(Section, json.loads(text))
    assert section.rows[0].start == "on" and section.rows[0].factor == "compile" and section.best is None
    assert section.by_mode == {} and section.regression is None  # absent: the default
    assert json.dumps(typed.dump(section)) == text  # the keys it was read with, in their order, unknown ones kept
    changed = typed.replace(section, regression="slower", seconds=3.0)
    assert list(typed.dump(changed)) == ["seconds", "rows", "newer", "best", "regression"]
    assert typed.dump(changed)["seconds"] == 3.0


def test_what_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(TypeError, match="Section: expected a mapping, got list"):
        typed.load(Section, [1])


@dataclass(frozen=True, kw_only=True)
class Failed:
    rows: list[Row] | None = typed.key(omit_none=True, default=None)  # left out where the stage failed
    error: str | None = typed.key(omit_none=True, default=None)


def test_a_list_of_sections_that_may_be_left_out_is_read_as_sections() -> None:
    text = '{"rows": [{"factor": "threads", "from": "4"}]}'
    section = typed.load(Failed, json.loads(text))
    assert section.rows is not None and section.rows[0].start == "4"
    assert json.dumps(typed.dump(section)) == text
    assert typed.dump(Failed(error="crash")) == {"error": "crash"}
