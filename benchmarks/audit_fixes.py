"""What each fix the audit suggests costs, against the op it replaces, measured in one run.

The fixes are in ``reproci/worker/audit/fixes.py``. For each: the op and its fix on the same inputs
(forward and, where the op is a backward, backward), interleaved, median of --reps timings
of --iters calls each; printed as fix / op. Defaults are shapes of the reference embedding
model and a transformer's sequence dimension. ``--device cuda`` measures on a GPU (strict
mode on, so the op there is its deterministic kernel where torch has one).

    python benchmarks/audit_fixes.py [--device cpu] [--reps 7] [--iters 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reproci.worker.audit.fixes import DeterministicEmbedding, cumsum_by_matmul, segment_sum  # noqa: E402


def timed(fn: Callable[[], object], iters: int, device: str) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def compare(name: str, op: Callable[[], object], fix: Callable[[], object], reps: int, iters: int, device: str) -> float:
    a, b = [], []
    for _ in range(reps):  # interleaved: drift on a shared machine hits both
        a.append(timed(op, iters, device))
        b.append(timed(fix, iters, device))
    ratio = statistics.median(b) / statistics.median(a)
    print(f"{name:44} op {statistics.median(a) * 1e6:9.1f} µs   fix {statistics.median(b) * 1e6:9.1f} µs   "
          f"fix / op = {ratio:.2f}", flush=True)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dev, reps, iters = args.device, args.reps, args.iters
    print(f"torch {torch.__version__} on {dev}, 1 thread" if dev == "cpu" else f"torch {torch.__version__} on "
          f"{torch.cuda.get_device_name(0)}")

    vocab, dim, tokens = 1000, 64, 16 * 32  # the embedding reference: a batch of 16 × 32 tokens
    index = torch.randint(0, vocab, (tokens,), device=dev)
    src = torch.randn(tokens, dim, device=dev)
    compare("index_add_ (duplicate indices) → segment_sum", lambda: torch.zeros(vocab, dim, device=dev).index_add_(0, index, src),
            lambda: segment_sum(src, index, vocab), reps, iters, dev)
    compare("index_put_(accumulate=True) → segment_sum",
            lambda: torch.zeros(vocab, dim, device=dev).index_put_((index,), src, accumulate=True),
            lambda: segment_sum(src, index, vocab), reps, iters, dev)

    plain, fixed = torch.nn.Embedding(vocab, dim).to(dev), DeterministicEmbedding(vocab, dim).to(dev)
    ids = index.reshape(16, 32)

    def step(m: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            m.zero_grad(set_to_none=True)
            m(ids).sum().backward()
        return run
    compare("embedding forward+backward → DeterministicEmbedding", step(plain), step(fixed), reps, iters, dev)

    seq = torch.randn(16, 128, dim, device=dev)
    compare("cumsum over 128 positions → cumsum_by_matmul", lambda: seq.cumsum(1), lambda: cumsum_by_matmul(seq, 1),
            reps, iters, dev)


if __name__ == "__main__":
    main()
