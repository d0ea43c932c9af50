"""The YAML files reproci reads (reproci.yaml, image manifests, goldens) cannot exhaust it: a
"billion laughs" bomb of aliases, an oversized file and a key given twice are each one line and
the reader's exit code, in milliseconds and a few MB; shared anchors within bounds still read.

Each reader is driven through the real CLI in-process; nothing trains.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from reproci import errors, safe_yaml

GOLDEN_HEAD = "version: 1\nsidecar: null\n"


def bomb(levels: int) -> str:
    """A 'billion laughs' mapping under ``models:``: 9 ** levels strings from ``levels`` + 1 lines."""
    lines = ["models:", '  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# (what the CLI runs, the file it reads, what it writes before the YAML under test, its exit code)
READERS = {
    "reproci.yaml": (("run", "--config", "reproci.yaml", "--steps", "1"), "reproci.yaml", "", errors.EXIT_USAGE),
    "manifest": (("images", "list", "--manifest", "manifest.yaml"), "manifest.yaml", "version: 1\nimages: {}\n",
                 errors.EXIT_USAGE),
    "golden": (("golden", "show", "local"), "goldens/local.yaml", GOLDEN_HEAD, errors.EXIT_GOLDEN),
}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "goldens").mkdir()
    return tmp_path


def measured(cli, args: tuple[str, ...]) -> tuple[int, str, float, float]:
    """The CLI's exit code and stderr, with the seconds and peak MB the call took."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        code, _, err = cli(*args)
        seconds = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    return code, err, seconds, peak


@pytest.mark.parametrize("reader", READERS)
def test_a_yaml_bomb_is_refused_in_under_a_second_and_a_few_mb(cli, work, reader):
    """Aliases are counted on the composed nodes before anything expands them: a bomb of 9 ** 7
    values (the error message of the plain reader formatted them all) is one line, the reader's
    exit code, under a second and 20 MB."""
    args, name, head, exit_code = READERS[reader]
    (work / name).write_text(head + bomb(7))
    code, err, seconds, peak = measured(cli, args)
    assert code == exit_code and "its aliases repeat more than 10,000 values; write the values out" in err, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert seconds < 1 and peak < 20, (seconds, peak)


@pytest.mark.parametrize("reader", READERS)
def test_a_file_over_its_limit_is_refused_unread(cli, work, reader):
    """A 50 MB file is refused from its first limit + 1 bytes: one line, no 50 MB in memory."""
    args, name, head, exit_code = READERS[reader]
    with open(work / name, "w") as f:
        f.write(head + "# " + "x" * 50_000_000 + "\n")
    code, err, _, peak = measured(cli, args)
    assert code == exit_code and "MiB, more than such a file may hold" in err, err
    assert peak < 40, peak


@pytest.mark.parametrize("reader", READERS)
def test_a_key_given_twice_is_an_error_at_its_line(cli, work, reader):
    """Plain YAML keeps the last of two equal keys silently: here it is an error naming both lines."""
    args, name, head, exit_code = READERS[reader]
    (work / name).write_text(head + "models: {}\nmodels: {}\n")
    code, err, _, _ = measured(cli, args)
    line = len(head.splitlines()) + 2
    assert code == exit_code and f"line {line}: " in err, err
    assert f"the key 'models' is given twice (first at line {line - 1}); keep one" in err, err


def test_a_value_inside_itself_is_refused(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(safe_yaml.Refused, match="repeats a value inside itself"):
        safe_yaml.load(path, limit=safe_yaml.MiB)


def test_anchors_within_bounds_and_merge_keys_still_read(tmp_path):
    """The fixed twin: shared settings by anchor, and a merge key whose keys the mapping overrides."""
    path = tmp_path / "f.yaml"
    path.write_text("base: &b {steps: 4, seed: 1}\nrun: {<<: *b, seed: 2}\nmore: [*b, *b]\n")
    assert safe_yaml.load(path, limit=safe_yaml.MiB) == {"base": {"steps": 4, "seed": 1}, "run": {"steps": 4, "seed": 2},
                                                         "more": [{"steps": 4, "seed": 1}] * 2}
