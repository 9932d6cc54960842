"""Convergence parity: train a small Llama-style model with every candidate of an op and judge
each loss curve against the reference's seed-to-seed band (``kernelbench train``)."""

from .band import Band, make_band, step_band, tail_window
from .candidates import layer_ops, resolve
from .data import MarkovStream
from .loop import TrainCandidate, optimizer_state_bytes, train_run
from .run import LOSSES_CSV, TRAIN_JSON, TrainResult, TrainSettings, train, with_changes

__all__ = ["Band", "LOSSES_CSV", "MarkovStream", "TRAIN_JSON", "TrainCandidate", "TrainResult",
           "TrainSettings", "make_band", "optimizer_state_bytes", "resolve", "step_band", "tail_window", "train",
           "train_run", "layer_ops", "with_changes"]
