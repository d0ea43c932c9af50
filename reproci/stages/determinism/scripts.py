"""A script model's runs in the determinism stage (``--script``): the team's own command from
scratch twice and its resume command once (``reproci.worker.script``), and the one check only a
script needs, that run C resumed at all."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from ...errors import WorkerFailed
from ...golden.divergence import step_rows
from ...settings.models import ModelRef
from ...worker.process.spec import ScriptCommand, WorkerSpec
from ...worker.run_record import RunRecord

SCRIPT_COPY = "out-at-k"  # run A's {out} as its step k + 1 began: what run C's {out} is a copy of


def plan(base: WorkerSpec, model: ModelRef, k: int) -> dict[str, WorkerSpec]:
    """Runs A, B and C of a script model: its own command from scratch twice (B under other seeds),
    A copying its {out} as its step k + 1 begins, and its resume command on a copy of that
    (``worker.script``)."""
    assert model.script is not None
    train = ScriptCommand(command=model.script.command, cwd=str(model.script.cwd), resume_at=k,
                          config=model.script.config())
    a = dataclasses.replace(base, script=train, checkpoint_at=k, checkpoint_path=SCRIPT_COPY,
                            final_dump_path="final-A.pt")
    # B's seeds are not A's (its hash seed is): a script seeds what it draws, or its runs differ, as two
    # launches without reproci would; reproci's seeding must not make an unseeded script look reproducible
    b = dataclasses.replace(base, role="B", output="record-B.json", script=train, seed=base.seed + 1,
                            hash_seed=base.seed)
    c = dataclasses.replace(base, role="C", output="record-C.json", resume_from=SCRIPT_COPY,
                            script=dataclasses.replace(train, command=model.script.resume))
    return {"A": a, "B": b, "C": c}


def resume_unread(records: dict[str, RunRecord], k: int) -> str | None:
    """Why a script model's run C did not resume (its state before its first step is run A's at
    step 0, not at step k: the resume command trained from scratch), or None."""
    a, c = records["A"].initial_fingerprint, records["C"].initial_fingerprint
    at_k = step_rows(records["A"]).get(k)
    if not a or not c or at_k is None or a["names"] != c["names"] or a["row"] != c["row"]:
        return None
    if [at_k.get(n) for n in c["names"]] == c["row"]:
        return None  # k steps left the state as it was: nothing tells the two apart
    return (f"the resume command started from step 0, not from the checkpoint in {{out}}: its state before its first "
            f"step is run A's initial state, not A's at step k = {k}; make it load the checkpoint the script wrote "
            "in {out} (e.g. --init_from resume, --resume_from_checkpoint {out}/checkpoint-" + str(k) + ")")


def check_resumed(model: ModelRef, records: dict[str, RunRecord], k: int) -> None:
    """A script model's run C that did not resume is an ERROR that says so, not a RESUME_BROKEN."""
    unread = resume_unread(records, k) if model.script is not None else None
    if unread is not None:
        raise WorkerFailed(f"run C: {unread}", kind="contract")


def remove_outputs(work: Path) -> None:
    """A script model's output folders (its checkpoints), as a factory model's checkpoints go."""
    for folder in (*work.glob("out-*"), work / SCRIPT_COPY):
        shutil.rmtree(folder, ignore_errors=True)
