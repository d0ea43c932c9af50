"""The bytes of a paired throughput run's turns (reproci.worker.turns on the worker side,
reproci.stages.throughput.lockstep on the orchestrator's): standard library only, so the host reads
them without importing torch."""

from __future__ import annotations

import struct

# A turn's answer: b"d", the step's clocked seconds (-1: not a timed step), and 1 when it was
# the run's last step. Written in one call (well under PIPE_BUF), so it arrives whole.
DONE = struct.Struct("<cdB")
GO, END_TIMING = b"g", b"e"  # a turn: take a step; or stop timing (the profiled steps follow)
