"""transformer: a small GPT-style decoder trained on next-token prediction.

What it exercises: scaled_dot_product_attention with a causal mask, LayerNorm, dropout
(RNG in attention and residual paths), AdamW, and a warmup + cosine learning-rate
schedule (scheduler state must survive a resume). The layout follows nanoGPT
(Karpathy, 2022), scaled down. The corpus is a seeded Markov chain, so the loss falls.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup

from . import heldout


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64  # a small alphabet keeps the output layer cheap on a CPU
    block_size: int = 64  # context length
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128  # ~50 ms a step on one CPU thread: the check costs seconds, not minutes
    dropout: float = 0.1  # on, so the RNG is part of every step
    corpus_tokens: int = 20_000
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup_steps: int = 5  # short warm-up so a quick run sees both phases of the schedule
    total_steps: int = 200  # cosine period; the schedule keeps going past it at min_lr
    eval_tokens: int = 4096  # held-out text for eval_fn (variance stage): the same chain, a fresh walk

    @classmethod
    def for_profile(cls, profile: str) -> "GPTConfig":
        if profile == "full":  # GPU-sized
            return cls(vocab_size=512, block_size=128, n_layer=6, n_head=8, n_embd=512,
                       corpus_tokens=1_000_000, batch_size=64, warmup_steps=50, total_steps=2000, eval_tokens=65_536)
        return cls()


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)  # GPT-2 initialisation
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, vocab)


class MarkovCorpus(torch.utils.data.Dataset):
    """Windows of a token stream drawn from a seeded random transition matrix."""

    def __init__(self, cfg: GPTConfig, seed: int) -> None:
        g = torch.Generator().manual_seed(seed + 1)
        logits = 3.0 * torch.randn(cfg.vocab_size, cfg.vocab_size, generator=g)
        probs = torch.softmax(logits, dim=1)
        self.cdf = probs.cumsum(dim=1).tolist()  # the held-out text walks the same chain
        self.tokens = walk(self.cdf, torch.rand(cfg.corpus_tokens, generator=g).tolist())
        self.block = cfg.block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[i * self.block : (i + 1) * self.block + 1]
        return chunk[:-1], chunk[1:]  # (T,), (T,)


def walk(cdf: list[list[float]], draws: list[float]) -> torch.Tensor:
    """Walk the chain from token 0: each next token from the row of the current one."""
    tokens = [0]
    for u in draws[1:]:
        tokens.append(min(bisect.bisect_left(cdf[tokens[-1]], u), len(cdf) - 1))
    return torch.tensor(tokens, dtype=torch.long)


def evaluator(cfg: GPTConfig, cdf: list[list[float]], seed: int):
    """eval_fn: next-token accuracy and loss on a held-out walk of the same chain."""

    def eval_fn(model: nn.Module) -> dict[str, float]:
        g = torch.Generator().manual_seed(seed + 1 + heldout.OFFSET)
        tokens = walk(cdf, torch.rand(cfg.eval_tokens, generator=g).tolist())
        n = (len(tokens) - 1) // cfg.block_size
        x = tokens[: n * cfg.block_size].view(n, cfg.block_size)  # (n, T)
        y = tokens[1 : n * cfg.block_size + 1].view(n, cfg.block_size)  # (n, T)
        dev, bs = heldout.device_of(model), cfg.batch_size
        return heldout.metrics((model(x[i : i + bs].to(dev)).flatten(0, 1), y[i : i + bs].to(dev).flatten())
                               for i in range(0, n, bs))

    return eval_fn


def warmup_cosine(cfg: GPTConfig):
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))  # floor at 10 % of lr

    return factor


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def build(ctx: ModelContext) -> TrainSetup:
    cfg = GPTConfig.for_profile(ctx.profile)
    model = GPT(cfg).to(ctx.device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg))
    data = MarkovCorpus(cfg, seed=ctx.seed)
    loader = torch.utils.data.DataLoader(  # above one rank: this rank's shard of a seeded order
        data, batch_size=cfg.batch_size, **ctx.shuffling(data), generator=ctx.generator(), drop_last=True
    )
    return TrainSetup(
        model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, loss_fn=_loss,
        grad_clip=1.0, batch_size=cfg.batch_size, config=asdict(cfg), eval_fn=evaluator(cfg, data.cdf, ctx.seed),
    )
