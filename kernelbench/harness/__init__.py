"""Measurement: timing loops, statistics, memory, parity, device ceilings, the environment
fingerprint, and the runner that drives any op's cases through them."""
