"""Exit codes of ``python -m reproci.worker``. Standard library only: the orchestrator
reads them too (a container that cannot import torch has no record to read).

Exit codes have their own range, apart from the CLI's (0 pass, 1 repro failure, 3 drift,
4 run error, 5 infrastructure, 6 golden), so that a worker's status is never read as a
verdict or the other way round:

- 0: the record was written;
- 10: any other failure (a crash in the model's code or the harness);
- 11: the model breaks the plugin contract;
- 12: a determinism control did not take effect;
- 13: the device asked for does not exist in this process (or, for a compiled CPU run, a C++ compiler);
- 14: torch or numpy is missing;
- 15: the model uses an op with no deterministic kernel on this device (strict mode raises);
- 16: the loss or the trained state is not finite (NaN or infinity);
- 2 (wrong arguments) and 130 (interrupted) mean what they mean for the CLI;
- 1 is Python's own, for a spec that cannot be read: no record can be written then.

On failure an error record (status "error") is written in place of the run record; its
``error_kind`` ("crash", "contract", "attestation", "no-device", "missing-dependency",
"no-deterministic-kernel", "non-finite", "interrupted") says the same as the exit code, and it is what the orchestrator reads.
"""

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CRASH = 10
EXIT_CONTRACT = 11
EXIT_ATTESTATION = 12
EXIT_NO_DEVICE = 13
EXIT_MISSING_DEPENDENCY = 14
EXIT_NO_DETERMINISTIC_KERNEL = 15
EXIT_NON_FINITE = 16
EXIT_INTERRUPTED = 130
