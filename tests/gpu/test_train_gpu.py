"""kernelbench train on the GPU: the stream is sampled on the device, the loop makes no host
synchronisation between its finiteness checks, and our kernels train like their references
under bf16 autocast."""

import pytest
import torch

from kernelbench.models import CONFIGS
from kernelbench.train import MarkovStream, TrainSettings, resolve, train, train_run
from kernelbench.train.loop import initial_state

pytestmark = pytest.mark.gpu


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


def test_stream_lives_on_the_device_and_matches_its_floor():
    stream = MarkovStream(4096, n_sequences=2048, seq=256, seed=0, device="cuda")
    assert stream.tokens.device.type == "cuda"
    assert stream.empirical_loss_floor() == pytest.approx(stream.stats.entropy_rate, rel=0.01)


@pytest.mark.parametrize("op, candidate", [("adamw", "triton"), ("adam-mini", "triton-fp8")])
def test_steps_make_no_host_sync(op, candidate):
    """Between the first step (kernel compilation, allocator warm-up) and the end, a training
    step with our optimizers never waits for the GPU."""
    config = CONFIGS["llama-7m"]
    stream = MarkovStream(config.vocab_size, n_sequences=8 * 16, seq=128, device="cuda")
    init = initial_state(config, 0, "cuda")
    cand = next(c for c in resolve(op, config, names=[candidate]) if c.name == candidate)
    steps = 8

    def on_step(step):  # sync debug mode on after step 0, off after the last step
        torch.cuda.set_sync_debug_mode("error" if step < steps - 1 else "default")

    try:
        log = train_run(cand, config, init, stream, steps=steps, batch=16, device="cuda", check_every=10**9,
                        on_step=on_step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(torch.tensor(log.losses)).all() and log.median_step_ms > 0


@pytest.mark.parametrize("op, candidate", [("adamw", "triton"), ("rmsnorm", "kernelbench")])
def test_our_kernels_train_like_the_reference(op, candidate, tmp_path):
    settings = TrainSettings.defaults("cuda", steps=120, batch=16, seq=128)
    cands = resolve(op, CONFIGS[settings.model], names=[candidate])
    result = train(op, cands, settings, Rows(), tmp_path)
    outcome = {o.name: o for o in result.outcomes}
    assert outcome[candidate].status == "pass", outcome[candidate].message
    assert outcome[candidate].log.tokens_per_s > 0
    # the model uses the context (below the unigram entropy) and cannot beat the floor
    assert result.stats.entropy_rate < result.band.mean < result.stats.unigram_entropy
