"""The training state: checkpoints, named tensors, RNGs, per-step fingerprints, bits, the state census.

Worker side: the standard library, torch and numpy only."""
