"""One home for errors and exit codes.

Only ``reproci.cli.main`` catches these and turns them into an exit code and one
line on stderr. Messages say what failed, why, and what to do next.

Exit codes (stable, documented in the README):

====  ==========================================================================
0     every model passed (or is NEW outside CI)
1     reproducibility failure: NONDETERMINISTIC, RESUME_BROKEN or REPLICAS_DIVERGE (or, with
      --probes-fail, a portability dependency)
2     usage or configuration error (bad flag, malformed reproci.yaml, unknown model)
3     golden drift: UPGRADE_CHANGED, ENV_CHANGED, GOLDEN_MISMATCH, or NEW in CI
      (reproci compare --fail-worse: B is worse outside seed noise)
4     a run could not complete (ERROR verdict: crash, timeout, broken plugin)
5     infrastructure: engine unreachable, image missing, disk full, no GPU
6     golden file unreadable, corrupt or of another format version
7     ``reproci compare``: fewer than 3 seeds on a side, too few to tell a change from seed noise
130   interrupted (Ctrl-C); nothing half-written is left behind
====  ==========================================================================
"""

from __future__ import annotations

import signal
from typing import Iterable

EXIT_PASS = 0
EXIT_REPRO_FAILURE = 1
EXIT_USAGE = 2
EXIT_DRIFT = 3
EXIT_RUN_ERROR = 4
EXIT_INFRA = 5
EXIT_GOLDEN = 6
EXIT_TOO_FEW_SEEDS = 7
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + 2
EXIT_TERMINATED = 143  # SIGTERM (a cancelled CI job): 128 + 15, as shells report it

# Exit codes from least to most serious: a verdict's (pass < drift < a reproducibility failure <
# a run error), then those of a run that gave no verdict (bad usage, a golden that cannot be read,
# the infrastructure). Where models, shards or cells end differently, the most serious wins.
SEVERITY = (EXIT_PASS, EXIT_DRIFT, EXIT_REPRO_FAILURE, EXIT_RUN_ERROR, EXIT_USAGE, EXIT_GOLDEN, EXIT_INFRA)


def most_serious(codes: Iterable[int]) -> int:
    """The most serious of several exit codes (an unknown code counts as the most serious); none: pass."""
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=EXIT_PASS)


class ReprociError(Exception):
    """Base error: carries the exit code the CLI returns."""

    return_code = EXIT_RUN_ERROR


class UsageError(ReprociError):
    """Bad flags or option values."""

    return_code = EXIT_USAGE


class ConfigError(ReprociError):
    """reproci.yaml or a manifest is malformed."""

    return_code = EXIT_USAGE


class ModelError(ReprociError):
    """Unknown model, missing plugin file, or a factory that breaks the contract."""

    return_code = EXIT_USAGE


class RunError(ReprociError):
    """A worker could not complete."""

    return_code = EXIT_RUN_ERROR


class InfrastructureError(ReprociError):
    """The engine, the image, the disk or the GPU is not there."""

    return_code = EXIT_INFRA


class GoldenError(ReprociError):
    """A golden file is unreadable, corrupt, or of another format version."""

    return_code = EXIT_GOLDEN


class WorkerFailed(RunError):
    """One worker run failed; carries its error kind (crash, timeout, contract, ...) for the
    verdict's evidence. Caught by the stages, which turn it into an ERROR verdict."""

    def __init__(self, message: str, kind: str = "crash") -> None:
        super().__init__(message)
        self.kind = kind


class NotReproducibleError(ReprociError):
    """The run a golden would come from did not reproduce itself (``pr-body --require-reproducible``)."""

    return_code = EXIT_REPRO_FAILURE


class ResultsError(ReprociError):
    """A results file is unreadable or of another format version."""

    return_code = EXIT_USAGE


class TooFewSeedsError(ReprociError):
    """``reproci compare`` was given fewer than 3 seeds on a side: too few for an interval."""

    return_code = EXIT_TOO_FEW_SEEDS


def how_ended(returncode: int | None) -> str:
    """How a process ended (a worker run, a fork server), as a message says it: 'was killed
    (SIGKILL: out of memory, or killed by hand)', 'died with exit code 1'."""
    if returncode is not None and (returncode < 0 or returncode in (132, 137, 139, 143)):
        signum = -returncode if returncode < 0 else returncode - 128
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
        why = {"SIGKILL": ": out of memory, or killed by hand", "SIGSEGV": ": a crash in native code",
               "SIGTERM": ": stopped from outside",
               "SIGILL": ": an illegal instruction, likely code built for instructions this CPU lacks: a "
                         "--cpu-isa or image cpu_isa above this CPU, or a build for another CPU"}.get(name, "")
        return f"was killed ({name}{why})"
    return f"died with exit code {returncode}"
