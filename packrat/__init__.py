"""packrat: latency-optimal CPU inference serving for PyTorch models on TorchServe."""

__version__ = "0.1.0"
