"""Deliberately broken RMSNorm candidates, loaded as a plugin, that the harness's guards must catch:

    kernelbench parity rmsnorm --plugin tests/plugins/broken_rmsnorm.py -c broken-zeros -m fwd --device cpu

Each computes nothing, or something that only looks right: zeros, its input, the result of the
first inputs it saw, a result written into its input, and (CUDA only) a result written on a side
stream that the caller's stream never waits for.
"""

from kernelbench.ops import Requires, get_op
from kernelbench.ops.rmsnorm import rmsnorm_ref_hf

rmsnorm = get_op("rmsnorm")


@rmsnorm.candidate("broken-zeros")
def zeros():
    """Returns zeros of the right shape."""
    import torch

    return lambda x, weight, eps: torch.zeros_like(x)


@rmsnorm.candidate("broken-identity")
def identity():
    """Returns its input."""
    return lambda x, weight, eps: x


@rmsnorm.candidate("broken-cached")
def cached():
    """Computes the first call's result and returns it for every call after."""
    memo = {}

    def fn(x, weight, eps):
        if "y" not in memo:
            memo["y"] = rmsnorm_ref_hf(x, weight, eps).detach()
        return memo["y"]

    return fn


@rmsnorm.candidate("broken-mutates-input")
def mutates_input():
    """Writes the (right) result into x and returns x."""
    import torch

    def fn(x, weight, eps):
        with torch.no_grad():
            return x.copy_(rmsnorm_ref_hf(x, weight, eps))

    return fn


@rmsnorm.candidate("broken-side-stream", requires=Requires(cuda=True))
def side_stream():
    """Computes the right result on a side stream the caller's stream does not wait for, after a
    few milliseconds' spin (a slow kernel): the caller's stream, and its CUDA events, see nothing."""
    import torch

    stream = torch.cuda.Stream()

    def fn(x, weight, eps):
        out = torch.empty_like(x)
        stream.wait_stream(torch.cuda.current_stream())  # its inputs are ready; its result is not awaited
        with torch.cuda.stream(stream):
            torch.cuda._sleep(5_000_000)
            out.copy_(rmsnorm_ref_hf(x, weight, eps))
        return out

    return fn
