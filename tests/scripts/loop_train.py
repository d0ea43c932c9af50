"""A plain training loop: ``loop_train.py STEPS OUT [--resume] [--clock] [--stop-at S] [--crash]``.

A checkpoint of the model, the optimizer, the step and the RNG state after every step in OUT/ckpt.pt;
--resume continues from it. --clock seeds from the clock (NONDETERMINISTIC); --stop-at ends the loop
after S steps whatever STEPS says; --crash raises after the first step; --no-train never steps; --fast-kernels switches
deterministic algorithms off.
"""

import argparse
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("out")
parser.add_argument("--resume", action="store_true")
parser.add_argument("--clock", action="store_true")
parser.add_argument("--stop-at", type=int, default=None)
parser.add_argument("--crash", action="store_true")
parser.add_argument("--no-train", action="store_true")
parser.add_argument("--fast-kernels", action="store_true")
args = parser.parse_args()
with open(os.path.join(args.out, "controls.txt"), "w") as f:  # what the script finds set as it starts
    f.write(f"{torch.are_deterministic_algorithms_enabled()} {os.environ.get('PYTHONHASHSEED')} {torch.initial_seed()}")
torch.manual_seed(time.time_ns() % 2**31 if args.clock else 0)
if args.fast_kernels:
    torch.use_deterministic_algorithms(False)  # "faster": a determinism control switched off
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
start = 0
if args.resume:
    checkpoint = torch.load(os.path.join(args.out, "ckpt.pt"))
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["rng"])
    start = checkpoint["step"]
for step in range(start, 0 if args.no_train else min(args.steps, args.stop_at or args.steps)):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.crash:
        raise RuntimeError("the loss went the wrong way")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1,
                "rng": torch.get_rng_state()}, os.path.join(args.out, "ckpt.pt"))
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(args.out, "final.pt"))
