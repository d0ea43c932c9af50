"""reproci: containerised reproducibility CI for PyTorch.

This package file imports nothing on purpose: ``pipeline.worker`` runs inside
arbitrary training images that have only python3, torch and numpy.
"""

__version__ = "0.1.0"
