"""A nanoGPT-style training script, written as people write them: a config of globals overridden by
--key=value flags, batches drawn with torch.randint from a token array, a checkpoint ckpt.pt in
out_dir every eval_interval iterations, and ``--init_from resume`` to continue from it.

As nanoGPT's own train.py does, its checkpoint holds the model, the optimizer, the iteration and
the best loss, and not the RNG state: a resumed run draws other batches (RESUME_BROKEN, the batch
first). ``--save_rng True`` saves and restores the RNG state too (a resume that is exact).
"""

import os
import sys

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

out_dir = "out"
eval_interval = 5
max_iters = 12
init_from = "scratch"  # or "resume"
save_rng = False
batch_size, block_size, n_embd, vocab = 4, 16, 32, 64
learning_rate = 1e-3
seed = 1337
device = "cpu"  # or cuda
for arg in sys.argv[1:]:  # nanoGPT's configurator, without exec: --key=value or --key value
    key, _, value = arg.lstrip("-").partition("=")
    if key not in globals():
        raise SystemExit(f"unknown config key {key}")
    globals()[key] = type(globals()[key])(value) if not isinstance(globals()[key], bool) else value == "True"

torch.manual_seed(seed)
data = np.random.default_rng(0).integers(0, vocab, size=4096, dtype=np.int64)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size]) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size]) for i in ix.tolist()])
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 2, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.1))

    def forward(self, x):
        h = self.ln(x)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        return logits, loss


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.1)
iter_num, best_val_loss = 0, 1e9
if init_from == "resume":
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location=device, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    if save_rng:
        torch.set_rng_state(checkpoint["rng"])


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.stack([model(*get_batch())[1] for _ in range(2)])
    model.train()
    return losses.mean().item()


while True:
    if iter_num % eval_interval == 0:
        rng = torch.get_rng_state()  # as this iteration began: a resume replays the evaluation too
        val = estimate_loss()
        if iter_num > 0:
            checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                          "best_val_loss": min(best_val_loss, val)}
            if save_rng:
                checkpoint["rng"] = rng
            os.makedirs(out_dir, exist_ok=True)
            torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    X, Y = get_batch()
    _, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    iter_num += 1
    if iter_num >= max_iters:
        break
print(f"iter {iter_num}: loss {loss.item():.4f}")
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(out_dir, "final.pt"))
