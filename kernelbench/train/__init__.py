"""Convergence parity: train a small Llama-style model with every candidate of an op and judge
each loss curve against the reference's seed-to-seed band (``kernelbench train``)."""

from .band import Band, make_band, step_band, tail_window
from .candidates import LAYER_OPS, resolve
from .data import MarkovStream
from .loop import TrainCandidate, optimizer_state_bytes, train_run
from .run import LOSSES_CSV, TRAIN_JSON, TrainResult, TrainSettings, train, with_changes

__all__ = ["Band", "LAYER_OPS", "LOSSES_CSV", "MarkovStream", "TRAIN_JSON", "TrainCandidate", "TrainResult",
           "TrainSettings", "make_band", "optimizer_state_bytes", "resolve", "step_band", "tail_window", "train",
           "train_run", "with_changes"]
