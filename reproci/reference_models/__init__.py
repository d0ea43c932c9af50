"""Reference models: one readable file each, and the registry that names them.

Each model is a factory ``build(ctx) -> TrainSetup`` following the plugin contract in
``reproci/worker/contract.py``. A user's own model follows the same contract and is
named on the command line as ``path/to/file.py:factory`` or ``module:factory``.

This package is imported inside training containers: standard library, torch and
numpy only.
"""

from __future__ import annotations

# name -> "module:factory". Explicit, not discovered: adding a model is a reviewed change.
REGISTRY: dict[str, str] = {
    "conv": "reproci.reference_models.conv:build",
    "transformer": "reproci.reference_models.transformer:build",
    "embedding": "reproci.reference_models.embedding:build",
}

DESCRIPTIONS: dict[str, str] = {
    "conv": "ResNet-style CNN, BatchNorm + dropout, augmentation in 2 loader workers",
    "transformer": "GPT-style decoder, SDPA causal attention, AdamW + warmup/cosine",
    "embedding": "DLRM-style recommender, EmbeddingBag tables, index_add_ pooling",
}
