"""The file readers under fuzz: goldens, results files, ``reproci.yaml`` and image manifests
fed random bytes, truncations of a real file and valid YAML/JSON of the wrong shape. Every
case must end in one of the documented exit codes with one line on stderr: none may raise
past the CLI (``reproci/cli.py`` turns errors into exit codes)."""

from __future__ import annotations

import json
import random

import pytest

from reproci import errors

from .helpers import ROOT

SEED = 20261201
SHAPES = ["", "null", "[]", "[1, 2]", "3", "'text'", "{}", "{models: 3}", "{version: 1}", "{version: 1, models: []}",
          "{version: 1, models: {conv: 3}}", "{version: 1, models: {conv: {final_sha256: 12}}}", "{images: []}",
          "{version: 1, images: {x: 3}}", "{version: 1, images: {x: {base: 3, tag: t}}}", "{steps: [1]}",
          "{unknown_key: 1}", "{schema: reproci.results, version: 1}", "{schema: reproci.results, version: 99}",
          "{schema: reproci.results, version: 1, models: 3}", "&a [*a]", "!!python/object:os.system {}"]


def cases(real: bytes, n_random: int = 25) -> list[bytes]:
    rng = random.Random(SEED)
    out = [s.encode() for s in SHAPES]
    out += [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 400))) for _ in range(n_random)]
    out += [real[: rng.randrange(1, len(real))] for _ in range(n_random)]
    out += [real.replace(b":", b"", 1), real.replace(b"\n", b"\n\t", 3)]
    return out


def _check(cli, args: tuple[str, ...], allowed: set[int]) -> None:
    code, _, err = cli(*args)
    assert code in allowed, (args, code, err)
    assert "Traceback" not in err, (args, err)
    assert code == 0 or len(err.strip().splitlines()) == 1, (args, err)  # a failure is one line


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_goldens(cli, work):
    (work / "goldens").mkdir()
    golden = work / "goldens" / "local.yaml"
    for data in cases((ROOT / "goldens" / "cpu-torch2.13.yaml").read_bytes()):
        golden.write_bytes(data)
        _check(cli, ("golden", "show", "local"), {errors.EXIT_GOLDEN})


def test_results_files(cli, work):
    real = json.dumps({"schema": "reproci.results", "version": 1, "models": [{"model": "conv", "verdict": "PASS"}],
                       "image": {"name": "local"}, "summary": {}}).encode()
    path = work / "results.json"
    for data in cases(real):
        path.write_bytes(data)
        for fmt in ("md", "json"):
            _check(cli, ("report", str(path), "--format", fmt), {errors.EXIT_USAGE, 0})


def test_config_files(cli, work):
    path = work / "reproci.yaml"
    for data in cases(b"steps: 4\nresume_at: 2\nmodels: [conv]\nthreads: 1\n"):
        path.write_bytes(data)
        # --steps 1 is refused after the config is read: no case may start a run
        _check(cli, ("run", "--config", str(path), "--steps", "1"), {errors.EXIT_USAGE})


def test_manifests(cli, work):
    path = work / "manifest.yaml"
    for data in cases((ROOT / "docker" / "manifest.yaml").read_bytes()):
        path.write_bytes(data)
        code, out, err = cli("images", "list", "--manifest", str(path))
        assert code in (0, errors.EXIT_USAGE, errors.EXIT_INFRA), (data[:60], code, err)
        assert "Traceback" not in err
