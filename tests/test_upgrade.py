"""Upgrades checked against a golden: a run whose packages differ from the golden's but whose
hashes match says the upgrade was checked (``reproci/golden/drift.py``)."""

from __future__ import annotations

import yaml

from reproci import verdicts
from reproci.golden.drift import upgrade_text
from tests.helpers import model_entry


def _edit_packages(path, **versions) -> None:
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    data = yaml.safe_load(path.read_text())
    data["packages"].update(versions)
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))


def test_a_run_that_matches_its_golden_across_an_upgrade_says_the_upgrade_was_checked(reproci) -> None:
    assert reproci("golden", "update", "-m", "conv", "--steps", "4").returncode == 0
    torch_now = yaml.safe_load((reproci.cwd / "goldens" / "local.yaml").read_text())["packages"]["torch"]
    _edit_packages(reproci.cwd / "goldens" / "local.yaml", torch="2.12.0", numpy="2.3.0", filelock="0.1")
    r = reproci("run", "-m", "conv", "--steps", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    entry = model_entry(reproci.latest(), "conv")
    assert entry["verdict"] == verdicts.PASS and entry["golden"]["upgrade_checked"] is True
    assert f"unchanged by the upgrade torch 2.12.0 → {torch_now}, numpy 2.3.0 → " in entry["message"]
    assert "(and 1 other package): matches the golden" in entry["message"]


def test_no_upgrade_no_claim() -> None:
    assert upgrade_text({"toolchain": {}, "packages": {}}) is None
    assert upgrade_text({"toolchain": {"torch": ["2.13.0+cpu", "2.14.1+cu130"]},
                         "packages": {"torch": ["2.13.0+cpu", "2.14.1+cu130"], "nvidia-cublas-cu13": [None, "13.0"]}}) \
        == "torch 2.13.0+cpu → 2.14.1+cu130, nvidia-cublas-cu13 13.0 (added)"
