"""A real local Slurm cluster for the tests: ``munged``, ``slurmctld`` and two ``slurmd``
(node1 and node2, one host, each its own port and spool: ``slurmd -N NAME``), all from
Debian's ``slurm-wlm`` and ``munge``, configured, run and stopped (by PID) under a temp dir.
The clients find it through ``SLURM_CONF`` (``Cluster.env``). ``cred_expire=5`` lets a requeued
task start again within seconds (Slurm's default holds it two minutes). Without the daemons the tests
skip, or fail under ``REPROCI_REQUIRE_SLURM=1`` (.ci/run installs them and sets it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from .helpers import ROOT, unavailable

NODES = ("node1", "node2")
CPUS_PER_NODE = 2  # each cell's runs at once: one per CPU (config_overrides: both nodes share this host's cores)
DAEMONS = ("munged", "slurmctld", "slurmd")

CONF = """\
ClusterName=reproci-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock,cred_expire=5
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=5
MinJobAge=300
SchedulerParameters=sched_interval=1
{nodes}
PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """``start()`` writes the key and slurm.conf and starts the daemons; ``close()`` stops them by PID."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.conf = tmp / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    def env(self) -> dict[str, str]:
        outside = {k: v for k, v in os.environ.items() if k not in ("REPROCI_FORK_SERVERS", "PYTEST_CURRENT_TEST")}
        return {**outside, "SLURM_CONF": str(self.conf), "PYTHONPATH": str(ROOT), "CI": "", "COLUMNS": "200"}

    def start(self) -> None:
        d = self.dir
        for sub in ("state", *(f"spool/{n}" for n in NODES)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge.key").write_bytes(os.urandom(1024))
        (d / "munge.key").chmod(0o400)
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} "
                          f"CPUs={CPUS_PER_NODE} State=UNKNOWN" for n in NODES)
        self.conf.write_text(CONF.format(host=host, ctld_port=_free_port(), dir=d, nodes=nodes, names=",".join(NODES)))
        self._daemon(["munged", "-F", "--force", f"--key-file={d}/munge.key", f"--socket={d}/munge.sock",
                      f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
        self._wait(lambda: (d / "munge.sock").exists(), "munged")
        self._daemon(["slurmctld", "-D", "-i"])
        for n in NODES:
            self._daemon(["slurmd", "-D", "-N", n])
        self._wait(self._idle, "two idle nodes (logs: slurmctld.log, slurmd-node*.log)")

    def _daemon(self, argv: list[str]) -> None:
        log = open(self.dir / f"{argv[0]}-{len(self.procs)}.out", "w")
        self.procs.append(subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True, text=True)
        return out.returncode == 0 and sorted(out.stdout.split()) == sorted([*NODES, "idle", "idle"])

    def _wait(self, ready, what: str, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"the test Slurm cluster did not start ({what}; ended: {dead}); logs in {self.dir}")
            time.sleep(0.2)

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=60)

    def close(self) -> None:
        if self.procs and self.procs[-1].poll() is None:  # a test that failed midway: its jobs go first
            self.run("scancel", "--full", "--partition=test")
            deadline = time.monotonic() + 15
            while self.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.3)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[Cluster]:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        unavailable("SLURM", f"{', '.join(missing)} not installed: `apt-get install -y slurm-wlm munge` (as .ci/run does)")
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.close()
