"""The record's Triton kernels (reproci.worker.kernels) give exactly the reference arithmetic's values.

No GPU here: the kernels run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, chosen
when triton is imported, so in a process of its own), the very kernels a GPU compiles. Each check
compares a run's record made through the kernels with the same run's record made by the reference
arithmetic (numpy on the CPU), value for value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .helpers import ROOT

pytest.importorskip("triton", reason="triton is in the test set-up (pyproject's test extra)")

SCRIPT = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from reproci.worker import kernels
    from reproci.worker.data.batchlog import BatchLog
    from reproci.worker.state.fingerprint import StepFingerprints

    def record(fused, width):
        """Four steps of a model holding every element type the state can hold, its batches too."""
        kernels.interpret_on_cpu = fused
        torch.manual_seed(0)
        layers = [torch.nn.Linear(7, 7) for _ in range(width)]
        m = torch.nn.Sequential(torch.nn.Linear(7, 40000 // 7), torch.nn.ReLU(), torch.nn.Linear(40000 // 7, 7), *layers)
        m[0].to(torch.bfloat16)
        m[2].to(torch.float16)
        m.register_buffer("count", torch.zeros(5, dtype=torch.int64))
        m.register_buffer("flag", torch.zeros(3, dtype=torch.bool))
        m.register_buffer("small", torch.zeros(3, dtype=torch.int8))
        m.register_buffer("wide", torch.zeros(4, dtype=torch.float64))
        m.register_buffer("phase", torch.zeros(2, dtype=torch.complex64))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        fp, log = StepFingerprints(m, opt), BatchLog()
        before = dict(kernels.COUNTS)
        for step in range(4):
            x = torch.randn(6, 7)
            batch = {"x": x, "y": torch.randint(-9, 9, (6,)), "mask": torch.rand(6, 3) > 0.5,
                     "img": torch.randint(0, 255, (6, 2, 3), dtype=torch.uint8), "scalar": torch.tensor(3.5),
                     "half": torch.randn(6, 5).half(), "t": torch.randn(3, 6).t(), "empty": torch.zeros(0, 4),
                     "d": torch.randn(6, 2, dtype=torch.float64)}
            log.add(batch)
            if step == 2:  # a gradient that goes missing, then comes back
                m[4].bias.grad = None
                m[4].bias.requires_grad_(False)
            if step == 3:
                m[4].bias.requires_grad_(True)
            h = m[0](x.bfloat16()).float().relu()
            out = m[2](h.half()).float()
            for layer in layers:
                out = layer(out)
            loss = out.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            m.count += step + 1
            m.small -= 3
            m.flag ^= True
            m.wide += 0.1
            m.phase += 1j
            fp.record()
        launches = (kernels.COUNTS["launches"] - before["launches"])
        return fp.to_lists(), list(log.values()), launches

    ref, fused = record(False, 2), record(True, 2)
    many = record(True, 30)
    print(json.dumps({"state": ref[0] == fused[0], "batch": ref[1] == fused[1], "ref": ref[1], "fused": fused[1],
                      "launches": [fused[2], many[2]], "steps": 4,
                      "differs": len({tuple(r) for r in ref[0]}) == 4}))
''')


def _run(script: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def compared() -> dict:
    return _run(SCRIPT)


def test_the_state_kernel_gives_the_reference_fingerprints_for_every_element_type(compared):
    """bf16, fp16, fp32, fp64, int64, int8, bool and complex state, a tensor of several chunks, a
    gradient missing at one step (ABSENT) and back at the next: every row equal, and rows differ by step."""
    assert compared["differs"]
    assert compared["state"]


def test_the_batch_kernels_give_the_reference_checksums(compared):
    """Floats, integers, bool, uint8 images, a 0-d tensor, fp16, a transposed (non-contiguous) tensor,
    an empty one and float64 in one batch: both checksums of every step equal."""
    assert compared["batch"], (compared["ref"], compared["fused"])


def test_launches_do_not_grow_with_the_number_of_tensors(compared):
    """2 layers or 30 more: the same launches over the run. A step: one launch per element type of
    the state (5 here) and of the batch (3), the batch's mixing, the batch's address table (a
    copy), and the state's when an address changed; the rest are tables and rows made once."""
    few, many = compared["launches"]
    assert few == many, compared["launches"]
    assert few <= 11 * compared["steps"] + 14, compared["launches"]
