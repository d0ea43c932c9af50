"""The per-step record on a GPU in a few launches: every state tensor's bit sum, and a batch's
two checksums, each in one Triton launch per element type, whatever the number of tensors.

On a GPU a training step takes milliseconds, and the reference arithmetic
(``state.wrapping_sums.segment_sums``, ``data.batchsum.device_sums``) spends them on launches (a few
per tensor or per width), on copies (a concatenation of the whole state, a running sum at a
wider type) and on host work per tensor. Here each byte is read once, at its own width:

* a table of the tensors' addresses and sizes, made on the host, reaches the device in one
  copy from pinned memory that does not block (and only when an address changed: a gradient
  freed and made again may land elsewhere);
* each program of a launch sums one chunk of one tensor (a chunk table, made once per layout,
  says which) and adds that wrapping sum into the tensor's column with an integer atomic.
  Integer addition modulo 2**w does not depend on order, so the value is exactly the
  reference's on any device, however the chunks are scheduled;
* the columns are rows of blocks preallocated on the device (zeroed once per block of
  ``ROWS_PER_BLOCK`` steps) and stay there until the run ends: no host synchronisation in a step.

Elements of up to 32 bits are summed in int32 lanes and added into int64 columns: the low 32
bits are the reference's sum modulo 2**32 (``normalised`` reads them as it does, signed).

The batch: a first launch per element type reads every word once and adds, per row chunk, its
position-weighted sum (into the tensor's order-sensitive column) and its sum weighted by the
position within the row (into the row's slot of a scratch buffer); a second launch mixes every
row's sum, adds it into its tensor's order-free column and clears the slot for the next step.
The weights are computed in the kernel from the position (``batchsum._position_weights``'s
formula): no weight array is read. What is left of the reference's arithmetic (each column
modulo 2**32, weighted by the tensor's place in its batch, summed) is a handful of integer
operations per step, done on the host when the run's record is written (``batch_values``).

Triton ships with the CUDA builds of torch. Where it is absent, or the tensors are not on a GPU,
or a tensor has a type or layout these kernels do not read, the reference arithmetic runs
instead (``usable``). On the CPU the same kernels run under Triton's interpreter
(``TRITON_INTERPRET=1`` and ``interpret_on_cpu``): the tests prove equality with the reference
arithmetic that way, and the benchmark counts what a step issues (``COUNTS``).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import torch

from .state.tensor_bits import flat_int

try:  # shipped with torch's CUDA builds; optional everywhere else
    import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - depends on the image
    triton = None
    tl = None

ROWS_PER_BLOCK = 256  # steps whose record rows are zeroed at once (one fill launch per block)
CHUNK = 16384  # elements one program of the state's launch sums
# What the kernels read directly: the integer views ``tensor_bits.flat_int`` makes (floats as the
# integers of their width, bool and float8 as uint8).
STATE_TYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
WORD_TYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)  # a batch's 64-bit elements are read as two words

# What the launches issued, for the benchmark's counts (``benchmarks/determinism_overhead.py``):
# kernel launches and copies, bytes they read and write, and the host time spent inside them.
COUNTS = {"launches": 0, "bytes": 0, "launch_s": 0.0}

# Run the kernels on CPU tensors too (under ``TRITON_INTERPRET=1``): for the tests and the
# benchmark's counts, never a run's default.
interpret_on_cpu = False
in_launch = False  # inside a launch (the benchmark does not count the interpreter's own torch calls)


def usable(device: torch.device) -> bool:
    """Whether the kernels run for tensors on ``device``: a GPU with Triton, or the CPU under
    Triton's interpreter when asked for."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpret_on_cpu and _interpreted()


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _block() -> int:
    # The interpreter runs a program as numpy calls: fewer, larger blocks cost it less.
    return CHUNK if _interpreted() else 1024


@functools.lru_cache(maxsize=2)
def _kernels(interpreted: bool) -> tuple[Any, Any, Any]:
    """The three kernels, made on first use (``triton.jit`` reads ``TRITON_INTERPRET`` then)."""
    del interpreted  # the cache key only

    @triton.jit
    def state_sums(table, n_tensors, chunks, n_chunks, out, like,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
        # table: n_tensors addresses, then their sizes, then their columns; chunks: per program,
        # its tensor, then (n_chunks on) its first element
        pid = tl.program_id(0)
        t = tl.load(chunks + pid)
        start = tl.load(chunks + n_chunks + pid)
        base = tl.load(table + t).to(like.dtype)
        n = tl.load(table + n_tensors + t)
        col = tl.load(table + 2 * n_tensors + t)
        acc = tl.zeros([BLOCK], dtype=tl.int64 if WIDE else tl.int32)
        for k in range(0, CHUNK, BLOCK):
            offs = start + k + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < n, other=0)
            acc += x.to(tl.int64 if WIDE else tl.int32)
        tl.atomic_add(out + col, tl.sum(acc, axis=0).to(tl.int64))

    @triton.jit
    def batch_words(table, n_tensors, chunks, n_chunks, full, rowsum, like, RB: tl.constexpr, CB: tl.constexpr):
        # table: per tensor its address, row length in words, row count, column and first row's
        # slot; chunks: per program its tensor, first row and first word in the row. A program
        # reads a tile of RB rows by CB words: short rows, many to a program.
        pid = tl.program_id(0)
        t = tl.load(chunks + pid)
        row0 = tl.load(chunks + n_chunks + pid)
        start = tl.load(chunks + 2 * n_chunks + pid)
        base = tl.load(table + t).to(like.dtype)
        length = tl.load(table + n_tensors + t)
        n_rows = tl.load(table + 2 * n_tensors + t)
        col = tl.load(table + 3 * n_tensors + t)
        slot = tl.load(table + 4 * n_tensors + t)
        r = row0 + tl.arange(0, RB)
        j = start + tl.arange(0, CB)
        pos = r[:, None] * length + j[None, :]
        keep = (r[:, None] < n_rows) & (j[None, :] < length)
        words = tl.load(base + pos, mask=keep, other=0).to(tl.int32)
        # batchsum._position_weights: ((p * 2654435761 + 0x7F4A7C15) & 0x7FFFFFFF) | 1, in int32
        w_full = (((pos.to(tl.int64) * 2654435761 + 0x7F4A7C15) & 0x7FFFFFFF) | 1).to(tl.int32)
        w_row = (((j.to(tl.int64) * 2654435761 + 0x7F4A7C15) & 0x7FFFFFFF) | 1).to(tl.int32)
        products = words * w_full  # int32 products wrap, as the reference's
        tl.atomic_add(full + col, tl.sum(tl.sum(products, axis=1), axis=0).to(tl.int64))
        tl.atomic_add(rowsum + slot + r, tl.sum(words * w_row[None, :], axis=1).to(tl.int64), mask=r < n_rows)

    @triton.jit
    def mix_rows(rowsum, row_column, n_rows, contents, BLOCK: tl.constexpr):
        # each row's weighted sum (its low 32 bits) mixed (batchsum._mixed), added into its
        # tensor's order-free column; the slot is cleared for the next step
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = i < n_rows
        s = tl.load(rowsum + i, mask=keep, other=0) & 0xFFFFFFFF
        mixed = ((s * 0x9E3779B1) ^ (s >> 15)) & 0xFFFFFFFF
        tl.atomic_add(contents + tl.load(row_column + i, mask=keep, other=0), mixed, mask=keep)
        tl.store(rowsum + i, tl.zeros([BLOCK], dtype=tl.int64), mask=keep)

    return state_sums, batch_words, mix_rows


def _launch(kernel: Any, grid: int, *args: Any, moved: int, **meta: Any) -> None:
    """Launch ``kernel`` over ``grid`` programs; count it and the bytes it moves."""
    global in_launch
    t = time.perf_counter()
    in_launch = True  # the interpreter's own tensor copies are not the record's
    try:
        kernel[(grid,)](*args, **meta)
    finally:
        in_launch = False
    COUNTS["launches"] += 1
    COUNTS["bytes"] += moved
    COUNTS["launch_s"] += time.perf_counter() - t


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A host table on the device: from pinned memory without blocking on a GPU (the pinned block
    is kept until the copy has run by torch's host allocator), the table itself on the CPU."""
    t0 = time.perf_counter()
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        out = host
    else:
        out = host.pin_memory().to(device, non_blocking=True)
    COUNTS["launches"] += 1
    COUNTS["bytes"] += 8 * len(values)
    COUNTS["launch_s"] += time.perf_counter() - t0
    return out


class Rows:
    """Record rows of a fixed width on a device, preallocated and zeroed by the block."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.width = width
        self.device = device
        self._block: torch.Tensor | None = None
        self._used = ROWS_PER_BLOCK

    def next(self) -> torch.Tensor:
        """A zeroed row for this step (a view of the current block; the blocks live as long as their rows)."""
        if self._used == ROWS_PER_BLOCK:
            self._block = torch.zeros((ROWS_PER_BLOCK, self.width), dtype=torch.int64, device=self.device)
            self._used = 0
            COUNTS["launches"] += 1
            COUNTS["bytes"] += self._block.numel() * 8
        assert self._block is not None
        row = self._block[self._used]
        self._used += 1
        return row


class StateSums:
    """The bit sums of one device's state tensors, each step into one row: the persistent tensors
    (bound views; their addresses do not change) and the gradients (read afresh each step; a
    missing one is a tensor of size 0 here, and the caller reads its column ``ABSENT``)."""

    def __init__(self, persistent: list[torch.Tensor], params: list[torch.nn.Parameter], device: torch.device) -> None:
        self.device = device
        self.persistent = persistent
        self.params = params
        self.params_flat = [flat_int(p.detach()) for p in params]
        kinds = [v.dtype for v in persistent] + [v.dtype for v in self.params_flat]
        order = sorted(range(len(kinds)), key=lambda i: STATE_TYPES.index(kinds[i]))
        sizes = [v.numel() for v in persistent] + [v.numel() for v in self.params_flat]
        # per element type: (its tensors' positions in the row, the first table entry, a view of that type)
        self.groups: list[tuple[torch.dtype, list[int], int]] = []
        for i in order:
            if not self.groups or self.groups[-1][0] != kinds[i]:
                self.groups.append((kinds[i], [], i))
            self.groups[-1][1].append(i)
        self.order = [i for _, members, _ in self.groups for i in members]
        self.narrow = torch.tensor([k.itemsize <= 4 for k in kinds], dtype=torch.bool)
        self.sizes = sizes
        chunk_lists = []
        for _, members, _ in self.groups:
            tensor, start = [], []
            for slot, i in enumerate(members):
                for s in range(0, sizes[i], CHUNK):
                    tensor.append(slot)
                    start.append(s)
            chunk_lists.append((tensor, start))
        self.chunks = [_to_device(t + s, device) if t else None for t, s in chunk_lists]
        self.n_chunks = [len(t) for t, _ in chunk_lists]
        self.rows = Rows(len(kinds), device)
        self._fixed = [v.data_ptr() for v in persistent]
        self._last: tuple[int, ...] | None = None
        self._table: torch.Tensor | None = None
        self._likes = [self._view(i) for _, _, i in self.groups]
        # what a launch reads (each tensor once, its table and its chunks) and writes (its columns)
        self._moved = [self._likes[g].element_size() * sum(sizes[i] for i in members)
                       + 8 * (4 * len(members) + 2 * self.n_chunks[g]) for g, (_, members, _) in enumerate(self.groups)]

    def _view(self, i: int) -> torch.Tensor:
        return self.persistent[i] if i < len(self.persistent) else self.params_flat[i - len(self.persistent)]

    def sums(self, grads: list[torch.Tensor | None]) -> torch.Tensor:
        """This step's row (on the device): ``grads`` are the parameters' gradients as flat
        integer views (None for a missing one), in the order the parameters were given."""
        ptrs = self._fixed + [0 if g is None else g.data_ptr() for g in grads]
        key = tuple(ptrs)
        if key != self._last:  # an address changed (or the first step): a new table
            values: list[int] = []
            n_fixed = len(self._fixed)
            for _, members, _ in self.groups:
                values += [ptrs[i] for i in members]
                values += [self.sizes[i] if i < n_fixed or grads[i - n_fixed] is not None else 0 for i in members]
                values += members
            self._table = _to_device(values, self.device)
            self._last = key
        row = self.rows.next()
        state_sums = _kernels(_interpreted())[0]
        first = 0
        assert self._table is not None
        for g, (_, members, _) in enumerate(self.groups):
            n = len(members)
            if self.n_chunks[g]:
                _launch(state_sums, self.n_chunks[g], self._table[first:first + 3 * n], n, self.chunks[g],
                        self.n_chunks[g], row, self._likes[g], moved=self._moved[g], CHUNK=CHUNK,
                        BLOCK=_block(), WIDE=self._likes[g].element_size() == 8)
            first += 3 * n
        return row

    def normalised(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of this group's columns (on the CPU) as the reference gives them: the columns of
        elements of up to 32 bits modulo 2**32, signed."""
        wrapped = (rows + 2**31) % 2**32 - 2**31
        return torch.where(self.narrow, wrapped, rows)


def state_usable(tensors: list[torch.Tensor]) -> bool:
    """Whether every one of these (flat integer views, dense) is read by the state kernel."""
    return all(t.dtype in STATE_TYPES and t.layout == torch.strided and t.is_contiguous() for t in tensors)


class BatchSums:
    """A batch's two checksums, per step, as columns left on the device: per tensor its
    position-weighted sum and its rows' mixed sums (``batch_values`` finishes them)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rows: dict[int, Rows] = {}  # per tensor count: rows of 2 columns a tensor
        self._layouts: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # per batch layout (``_layout``)
        self._scratch: torch.Tensor | None = None

    def add(self, words: list[torch.Tensor], rows: list[int]) -> torch.Tensor:
        """``words``: each tensor's int32-or-narrower flat view (64-bit elements as int32 pairs),
        ``rows``: its row count. Returns this step's row: the tensors' order-sensitive columns,
        then their order-free ones."""
        n = len(words)
        key = tuple((w.dtype, w.numel(), r) for w, r in zip(words, rows))
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= 64:  # batches of ever new shapes: keep the newest layouts only
                self._layouts.clear()
            layout = self._layouts[key] = self._layout(words, rows)
        groups, row_column, n_rows = layout
        if self._scratch is None or self._scratch.numel() < n_rows:
            self._scratch = torch.zeros(max(n_rows, 1024), dtype=torch.int64, device=self.device)
            COUNTS["launches"] += 1
        per = self._rows.get(n)
        if per is None:
            per = self._rows[n] = Rows(2 * n, self.device)
        row = per.next()
        table: list[int] = []  # per element type: its tensors' addresses, then the rest of its table
        for members, info, _, _, _ in groups:
            table += [words[i].data_ptr() for i in members]
            table += info
        table_d = _to_device(table, self.device)
        batch_words, mix = _kernels(_interpreted())[1:]
        first = 0
        for members, _, chunks, n_chunks, tile in groups:
            m = len(members)
            moved = sum(words[i].numel() * words[i].element_size() for i in members) + 8 * (5 * m + 3 * n_chunks)
            _launch(batch_words, n_chunks, table_d[first:first + 5 * m], m, chunks, n_chunks, row, self._scratch,
                    words[members[0]], moved=moved, RB=tile[0], CB=tile[1])
            first += 5 * m
        _launch(mix, -(-n_rows // 1024), self._scratch, row_column, n_rows, row[n:], moved=32 * n_rows, BLOCK=1024)
        return row

    def _layout(self, words: list[torch.Tensor], rows: list[int]) -> tuple[Any, ...]:
        """Per element type: its tensors, the rest of their table (row lengths, columns, first
        row slots) and their chunk table on the device; each row's column: made once per batch layout."""
        starts, total = [], 0
        for r in rows:
            starts.append(total)
            total += r
        row_column = [t for t, r in enumerate(rows) for _ in range(r)]
        block = _block()
        groups = []
        for kind in WORD_TYPES:
            members = [i for i, w in enumerate(words) if w.dtype == kind]
            if not members:
                continue
            lengths = [words[i].numel() // rows[i] for i in members]
            cb = min(block, triton.next_power_of_2(max(max(lengths), 1)))  # a tile: rb rows of cb words
            rb = block // cb
            tensor, first_row, start = [], [], []
            for slot, i in enumerate(members):
                for r in range(0, rows[i], rb):
                    for s in range(0, lengths[slot], cb):
                        tensor.append(slot)
                        first_row.append(r)
                        start.append(s)
            if tensor:
                info = lengths + [rows[i] for i in members] + members + [starts[i] for i in members]
                groups.append((members, info, _to_device(tensor + first_row + start, self.device), len(tensor), (rb, cb)))
        return groups, _to_device(row_column, self.device), total


def batch_usable(words: list[torch.Tensor]) -> bool:
    return all(w.dtype in WORD_TYPES and w.is_contiguous() for w in words)


def batch_values(rows: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Each step's (order-sensitive, order-free) checksums from its row (one copy for all of
    them): each tensor's column modulo 2**32, weighted by its place in its batch (2i+1), summed;
    the order-free one modulo 2**32, as ``batchlog`` keeps it."""
    if not rows:
        return []
    flat = torch.cat(rows).cpu().tolist()
    out, at = [], 0
    for r in rows:
        n = r.numel() // 2
        full, parts = flat[at:at + n], flat[at + n:at + 2 * n]
        at += 2 * n
        out.append((sum((v % 2**32) * (2 * i + 1) for i, v in enumerate(full)),
                    sum((v % 2**32) * (2 * i + 1) for i, v in enumerate(parts)) % 2**32))
    return out
