"""kernelbench: Triton kernel candidates (optimizers, Newton-Schulz, RMSNorm, rotary) and the
harness that measures them against PyTorch and the official packages."""

__version__ = "0.1.0"
