"""Goldens: the store of golden hashes per image, the comparison of runs (with each other
and with a golden), and the verdict on what changed."""
