"""An accelerate script as people write them: Accelerator.prepare, save_state every --save_every
steps into --out, a seedable sampler set to each epoch, and on --resume load_state then skip_first_batches over the epoch's batches
already seen. ``--no_skip`` leaves the skip out (a resume that trains on the first batches again)."""

import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--max_steps", type=int, default=12)
parser.add_argument("--save_every", type=int, default=6)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--no_skip", action="store_true")
args = parser.parse_args()
set_seed(0)

# a seedable sampler: each epoch's order comes from the seed and the epoch, so a resume can draw it again
accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 8, generator=g)
# a generator of its own: a DataLoader without one draws each iterator's base seed from torch's global RNG,
# and the resumed run's extra iterator (skip_first_batches) would move the dropout draws that follow
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1] * 2), batch_size=8, shuffle=True,
                                     generator=torch.Generator().manual_seed(0))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
step = 0
if args.resume:
    accelerator.load_state(os.path.join(args.out, "state"))
    step = int(open(os.path.join(args.out, "state", "step.txt")).read())
epoch_batches = len(loader)
while step < args.max_steps:
    epoch, seen = divmod(step, epoch_batches)
    loader.set_epoch(epoch)
    batches = loader
    if args.resume and seen and not args.no_skip:
        batches = accelerator.skip_first_batches(loader, seen)
    for xb, yb in batches:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        step += 1
        if step % args.save_every == 0:
            accelerator.save_state(os.path.join(args.out, "state"))
            open(os.path.join(args.out, "state", "step.txt"), "w").write(str(step))
        if step >= args.max_steps:
            break
    args.resume = False
torch.save({"model": accelerator.unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict()},
           os.path.join(args.out, "final.pt"))
