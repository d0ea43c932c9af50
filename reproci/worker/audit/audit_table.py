"""The audit's table: for each op strict determinism acts on, when it applies, what strict mode
does (raise, a slower deterministic kernel, fill memory), the fix, and what the fix costs.

Each entry names the items of ``torch.use_deterministic_algorithms``' documentation it stands
for (``docs``, prefixes of the items as ``audit.documented`` reads them); an item the table
does not cover is in ``EXCLUDED`` with the reason. ``tests/test_audit.py`` checks both ways
against the running torch, and ``reproci audit --check-table`` prints the difference for any
other. ``applies`` is the entry's condition on one recorded call (``oprecord``: its dtype,
overload, the argument that decides the kernel, whether grad flows, whether indices repeat);
``when`` says it in words, for the finding. (Worker side: stdlib and torch only.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .rows import OpRow as Row

RAISES, SLOWER, FILLS = "raises", "slower", "fills"


@dataclass(frozen=True)
class Entry:
    ops: tuple[str, ...]  # aten op names (the overload packet)
    cuda: str  # RAISES, SLOWER or FILLS
    docs: tuple[str, ...]  # the items of torch.use_deterministic_algorithms' docs it stands for
    when: str  # the condition, in words: "accumulate=True", "on a floating-point tensor", ...
    what: str  # what happens
    advice: str  # the fix, with its measured cost where there is one
    applies: Callable[[Row], bool] = lambda row: True
    device: str = "cuda"  # the device whose kernels it is about: "cuda", or "cpu" (deterministic CPU kernels)


def _variant(value: str) -> Callable[[Row], bool]:
    return lambda row: row["variant"] == value


def _floating(row: Row) -> bool:
    return "float" in row["dtype"] or "complex" in row["dtype"]


def _grad(row: Row) -> bool:
    return bool(row.get("grad"))


_ATOMICS = "nondeterministic on CUDA (atomic adds) unless strict; strict mode uses a slower deterministic kernel"
_NO_KERNEL = "strict mode raises on CUDA: torch has no deterministic CUDA kernel for it"
_CPU_SERIAL = "on the CPU, strict mode takes a serial deterministic kernel instead of the parallel one: slower"
_LAST_WRITE = "with repeated indices, which write wins is unspecified on CUDA unless strict; strict mode fixes it: slower"
# Measured by benchmarks/audit_fixes.py (2 cores, 1 thread, torch 2.13 CPU; on CUDA: benchmarks/gpu_check.sh)
SEGMENT_SUM = ("a sorted segment sum (reproci.worker.audit.fixes.segment_sum: argsort + torch.segment_reduce, no atomics; "
               "measured 7–10× the op on the CPU, where the op is already deterministic)")
EMBEDDING_FIX = ("reproci.worker.audit.fixes.DeterministicEmbedding: the weight gradient as a sorted segment sum "
                 "(measured 2.9× the embedding's forward+backward on the CPU; on CUDA it replaces the atomic adds)")
CUMSUM_FIX = ("reproci.worker.audit.fixes.cumsum_by_matmul (a triangular matmul, deterministic; measured 3.3× cumsum over "
              "128 positions on the CPU) for short dimensions, or cumsum in float64 on the CPU")
# torch's CUDA CTC has two paths: cuDNN's, always its deterministic algorithm, and the native kernel, whose backward
# strict mode refuses. transformers' *ForCTC heads turn cuDNN off around ctc_loss (and pass int64 targets), so they
# always take the native one; the CPU kernel is deterministic and its gradient flows back to the device.
CTC_FIX = ("compute the CTC loss on the CPU (ctc_loss(log_probs.cpu(), targets.cpu(), input_lengths.cpu(), "
           "target_lengths.cpu(), ...); the gradient flows back to the device); for a transformers *ForCTC model "
           "(Wav2Vec2ForCTC, HubertForCTC, ...), which turns cuDNN off around ctc_loss, set model.loss_function = "
           "lambda logits, labels, logit_lengths, **kw: transformers.loss.loss_ctc.ForCTCLoss(logits.cpu(), labels.cpu(), "
           "logit_lengths.cpu(), **kw).to(logits.device) (older transformers: call it without labels and compute "
           "that loss from its logits); torch's cuDNN CTC is deterministic too, but taken only with cuDNN on, blank 0, "
           "float32 log_probs, int32 targets concatenated on the CPU and every input length the full T")
_CONV = tuple(f"torch.nn.{m} when called on CUDA tensor" for m in
              ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"))

TABLE: tuple[Entry, ...] = (
    Entry(("convolution_backward",), SLOWER, _CONV, "the backward of a convolution on CUDA",
          "cuDNN is held to deterministic backward algorithms (benchmark off): slower",
          "the main cost of strict mode for conv nets (H200: conv reference 1.47× step time, convolution backward "
          "+316 %); channels_last and larger batches narrow it"),
    Entry(("index_put", "index_put_", "_index_put_impl_"), SLOWER, (), "accumulate=True (also the backward of x[idx] "
          "and of an embedding)", _ATOMICS + " (sorts the indices first)",
          "expected cost (H200: embedding reference 1.13× step time); for an embedding: " + EMBEDDING_FIX
          + "; for index_put_ itself: " + SEGMENT_SUM, _variant("accumulate=True")),
    Entry(("index_put", "index_put_", "_index_put_impl_"), SLOWER,
          ("torch.Tensor.__getitem__ when attempting to differentiate a CPU tensor and the index is a list of tensors",
           "torch.Tensor.index_put with accumulate=True when called on a CPU tensor"), "accumulate=True on a CPU tensor",
          _CPU_SERIAL, "expected cost on the CPU; " + SEGMENT_SUM, _variant("accumulate=True"), device="cpu"),
    Entry(("index_put", "index_put_", "_index_put_impl_"), SLOWER, ("torch.Tensor.index_put with accumulate=False",),
          "accumulate=False", _LAST_WRITE, "make the indices unique (torch.unique) when the value written may differ",
          _variant("accumulate=False")),
    Entry(("put_", "put"), SLOWER, ("torch.Tensor.put_ with accumulate=True when called on a CPU tensor",),
          "accumulate=True on a CPU tensor", _CPU_SERIAL, "expected cost on the CPU", _variant("accumulate=True"),
          device="cpu"),
    Entry(("index_add", "index_add_"), SLOWER, ("torch.index_add when called on CUDA tensor",), "on a CUDA tensor",
          _ATOMICS, SEGMENT_SUM),
    Entry(("index_select",), SLOWER, ("torch.index_select when attempting to differentiate a CUDA tensor",
                                      "torch.repeat_interleave when attempting to differentiate a CUDA tensor"),
          "when grad flows to its input (its backward is an index_add_; repeat_interleave runs an index_select)",
          _ATOMICS, SEGMENT_SUM + " in the backward; for repeat_interleave with equal repeats, expand + reshape "
          "(its backward is a sum)", _grad),
    Entry(("scatter_add", "scatter_add_"), SLOWER, ("torch.Tensor.scatter_add_ when called on a CUDA tensor",),
          "on a CUDA tensor", _ATOMICS, "on one dimension: " + SEGMENT_SUM),
    Entry(("gather",), SLOWER, ("torch.gather when called on a CUDA tensor that requires grad",),
          "when grad flows to its input (its backward is a scatter_add_)", _ATOMICS,
          "expected cost; where the index is one row per output, index_select has the same backward cost", _grad),
    Entry(("scatter", "scatter_"), SLOWER, ("torch.Tensor.scatter when src type is Tensor and called on CUDA tensor",),
          "with a tensor src", _LAST_WRITE, "make the indices unique per output position",
          lambda row: ".src" in row["overload"] or row["overload"].endswith("scatter.src_out")),
    Entry(("scatter_reduce", "scatter_reduce_"), SLOWER,
          ("torch.Tensor.scatter_reduce when reduce='sum' or reduce='mean' and called on CUDA tensor",),
          "reduce='sum' or 'mean'", _ATOMICS, "on one dimension: " + SEGMENT_SUM,
          lambda row: row["variant"] in ("reduce=sum", "reduce=mean")),
    Entry(("index_copy", "index_copy_"), SLOWER, ("torch.Tensor.index_copy when called on a CPU or CUDA tensor",),
          "on any device", "nondeterministic with repeated indices unless strict; strict mode serialises the copies",
          "expected cost; unique indices make it order-free"),
    Entry(("bmm",), SLOWER, ("torch.bmm when called on sparse-dense CUDA tensors",), "with a sparse operand",
          "the sparse-dense CUDA kernel accumulates with atomics unless strict", "expected cost; a dense bmm when it fits",
          lambda row: bool(row.get("sparse"))),
    Entry(("replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward"), SLOWER,
          tuple(f"torch.nn.ReplicationPad{d}d when attempting to differentiate a CUDA tensor" for d in (1, 2, 3)),
          "in the backward", _ATOMICS, "expected cost"),
    Entry(("max_pool3d_with_indices_backward",), SLOWER, ("torch.nn.MaxPool3d when attempting to differentiate",),
          "in the backward", _ATOMICS, "expected cost"),
    Entry(("_adaptive_avg_pool2d_backward",), RAISES, ("torch.nn.AdaptiveAvgPool2d when attempting to differentiate",),
          "in the backward", _NO_KERNEL, "global pooling: x.mean(dim=(-2, -1)); a fixed ratio: nn.AvgPool2d with that kernel"),
    Entry(("_adaptive_avg_pool3d_backward",), RAISES, ("torch.nn.AdaptiveAvgPool3d when attempting to differentiate",),
          "in the backward", _NO_KERNEL, "global pooling: x.mean(dim=(-3, -2, -1)); a fixed ratio: nn.AvgPool3d"),
    Entry(("adaptive_max_pool2d_backward",), RAISES, ("torch.nn.AdaptiveMaxPool2d when attempting to differentiate",),
          "in the backward", _NO_KERNEL, "nn.MaxPool2d with the matching kernel, or amax over the spatial dims"),
    Entry(("avg_pool3d_backward",), RAISES, ("torch.nn.AvgPool3d when attempting to differentiate",), "in the backward",
          _NO_KERNEL, "a strided 3-d convolution with fixed 1/k³ weights, or mean over reshaped windows"),
    Entry(("fractional_max_pool2d_backward", "fractional_max_pool3d_backward"), RAISES,
          ("torch.nn.FractionalMaxPool2d when attempting to differentiate",
           "torch.nn.FractionalMaxPool3d when attempting to differentiate"), "in the backward", _NO_KERNEL, "nn.MaxPool2d"),
    Entry(("max_unpool2d", "max_unpool3d"), RAISES, ("torch.nn.MaxUnpool1d", "torch.nn.MaxUnpool2d", "torch.nn.MaxUnpool3d"),
          "always (MaxUnpool1d runs max_unpool2d)", _NO_KERNEL, "a transposed convolution or interpolate(mode='nearest')"),
    Entry(("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
           "upsample_trilinear3d_backward"), RAISES, ("torch.nn.functional.interpolate when attempting to differentiate",),
          "in the backward of a linear, bilinear, bicubic or trilinear interpolation", _NO_KERNEL,
          "interpolate(mode='nearest') or a transposed convolution"),
    Entry(("reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward"), RAISES,
          tuple(f"torch.nn.ReflectionPad{d}d when attempting to differentiate a CUDA tensor" for d in (1, 2, 3)),
          "in the backward", _NO_KERNEL, "padding_mode='replicate' or 'zeros' (or reflect in the data pipeline, without grad)"),
    Entry(("nll_loss2d_forward",), RAISES, ("torch.nn.NLLLoss when called on a CUDA tensor",),
          "on a 2-d target with a reduction (mean or sum)", _NO_KERNEL,
          "flatten to (N·H·W, C) and (N·H·W,) before the loss", lambda row: row["variant"] != "reduction=0"),
    Entry(("_ctc_loss_backward",), RAISES, ("torch.nn.CTCLoss when attempting to differentiate",), "in the backward",
          _NO_KERNEL, CTC_FIX),
    Entry(("_embedding_bag_backward", "_embedding_bag_dense_backward"), RAISES,
          ("torch.nn.EmbeddingBag when attempting to differentiate a CUDA tensor when mode='max'",), "mode='max'",
          _NO_KERNEL, "mode='sum' or 'mean'", _variant("mode=2")),
    Entry(("put_",), RAISES, ("torch.Tensor.put_ when accumulate=False",), "accumulate=False", _NO_KERNEL,
          "index_put_ or scatter_", _variant("accumulate=False")),
    Entry(("put_",), RAISES, ("torch.Tensor.put_ when accumulate=True and called on a CUDA tensor",),
          "accumulate=True on a CUDA tensor", _NO_KERNEL, "index_put_(..., accumulate=True)", _variant("accumulate=True")),
    Entry(("histc",), RAISES, ("torch.histc when called on a CUDA tensor",), "on a CUDA tensor", _NO_KERNEL,
          "torch.bucketize then bincount without weights"),
    Entry(("bincount",), RAISES, ("torch.bincount when called on a CUDA tensor and weights",), "with weights", _NO_KERNEL,
          "scatter_add_ of the weights (deterministic, slower)", _variant("weights=tensor")),
    Entry(("median",), RAISES, ("torch.median with indices output when called on a CUDA tensor",),
          "with a dim (the values and indices form)", _NO_KERNEL, "torch.sort and take the middle element",
          lambda row: row["overload"].startswith("aten.median.dim")),
    Entry(("grid_sampler_2d_backward", "grid_sampler_3d_backward"), RAISES,
          ("torch.nn.functional.grid_sample when attempting to differentiate",), "in the backward", _NO_KERNEL,
          "no deterministic alternative in torch: keep the model out of the strict stage"),
    Entry(("cumsum",), RAISES, ("torch.cumsum when called on a CUDA tensor when dtype is floating point",),
          "on a floating-point tensor", _NO_KERNEL, CUMSUM_FIX, _floating),
    Entry(("scatter_reduce", "scatter_reduce_"), RAISES, ("torch.Tensor.scatter_reduce when reduce='prod'",),
          "reduce='prod'", _NO_KERNEL, "sum of logarithms with scatter_add_", _variant("reduce=prod")),
    Entry(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"), FILLS, (), "on every device",
          "strict mode fills its uninitialised output (NaN) on every device: one extra write per element",
          "small (H200: most of the transformer reference's 1.06×); torch.zeros where values are read"),
)

# Items of the documentation the table leaves out on purpose, and why.
EXCLUDED = {
    "torch.Tensor.resize_ when called with a quantized tensor":
        "quantized tensors are inference-time: a training step's resize_ is of float tensors, which strict mode does not touch",
}


_ALERT_SUFFIXES = ("gpu", "cuda", "out", "template", "kernel")


def raising_entry(alert: str) -> Entry | None:
    """The table's entry for the op that strict mode refused with ``alert``, the name torch's
    error starts with ("ctc_loss_backward_gpu", "histc_cuda", "upsample_bilinear2d_backward_out_cuda"):
    the aten op once its kernel's suffixes are gone; None for an op the table does not name."""
    words = alert.strip("_").split("_")
    while len(words) > 1 and words[-1] in _ALERT_SUFFIXES:
        words.pop()
    op = "_".join(words)
    return next((e for e in TABLE if e.cuda == RAISES and op in (o.strip("_") for o in e.ops)), None)
