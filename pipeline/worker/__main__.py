"""``python -m pipeline.worker SPEC.json``: one fresh-process training run.

Exit codes: 0 the record was written; 3 the model breaks the plugin contract;
4 a determinism control did not take effect; 5 torch or numpy is missing, or the
device asked for does not exist;
1 any other failure. On failure an
error record (status "error") is written in place of the run record.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

EXIT_OK, EXIT_CRASH, EXIT_CONTRACT, EXIT_ATTESTATION, EXIT_MISSING = 0, 1, 3, 4, 5


def _write(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pipeline.worker SPEC.json", file=sys.stderr)
        return 2
    spec_file = Path(argv[0]).resolve()
    from .spec import WorkerSpec, resolve

    spec = WorkerSpec.from_json(spec_file.read_text())
    out = resolve(spec_file, spec.output)
    assert out is not None
    try:
        from .contract import ContractError
        from .train import AttestationError, run

        record = run(spec, spec_file)
        _write(out, record)
        return EXIT_OK
    except BaseException as e:  # noqa: BLE001 - every failure becomes an error record
        kind, code = "crash", EXIT_CRASH
        if type(e).__name__ == "ContractError":
            kind, code = "contract", EXIT_CONTRACT
        elif type(e).__name__ == "AttestationError":
            kind, code = "attestation", EXIT_ATTESTATION
        elif type(e).__name__ == "DeviceUnavailable":
            kind, code = "no-device", EXIT_MISSING
        elif isinstance(e, ModuleNotFoundError) and e.name in ("torch", "numpy"):
            kind, code = "missing-dependency", EXIT_MISSING
        elif isinstance(e, KeyboardInterrupt):
            kind, code = "interrupted", 130
        message = (f"breaks the plugin contract: {e}" if kind == "contract"
                   else str(e) if kind in ("attestation", "no-device") else f"{type(e).__name__}: {e}").strip()
        _write(out, {
            "schema": "reproci.run", "version": 1, "status": "error", "error_kind": kind,
            "message": message.splitlines()[0][:500] if message else type(e).__name__,
            "traceback": traceback.format_exc()[-4000:], "model": spec.model_name, "role": spec.role,
        })
        print(f"reproci worker: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
