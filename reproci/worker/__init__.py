"""The worker side of reproci: code that runs inside the training process.

Boundary: every module in this package imports only the Python standard library,
torch and numpy, so ``python -m reproci.worker SPEC`` runs in any image that has
python3 and torch (an NGC PyTorch container, a distribution image, a venv).
``tests/test_worker_boundary.py`` enforces it.
"""
