"""Probe: the rows whose 8-bit row code differs between the sharded and the unsharded step 1 (2 GPUs)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import test_adafactor_fsdp_gpu as t  # noqa: E402

from kernelbench.distributed.spawn import run_ranks  # noqa: E402


def probe(rank, world):
    from kernelbench.distributed.fsdp import build_pair, device_for, full_grads, make_mesh, set_grads
    device = device_for(rank)
    mesh = make_mesh(device, world)
    plain, sharded = build_pair(t.CONFIG, 0, device, mesh)
    factory = t.CASES["8bit"]
    po, so = factory(list(plain.named_parameters())), factory(list(sharded.named_parameters()))
    out = []
    grads = full_grads(plain.named_parameters(), 1, 0, 1e-2, device)
    set_grads(plain, sharded, grads)
    po.step()
    so.step()
    ref = dict(plain.named_parameters())
    for name, p in sharded.named_parameters():
        st = so.state[p]
        if "row_q" not in st:
            continue
        full = st["row_q"].full_tensor() if hasattr(st["row_q"], "full_tensor") else st["row_q"]
        pst = po.state[ref[name]]
        diff = (full.int() - pst["row_q"].int()).nonzero().flatten().tolist()
        g = grads[name].double()
        r = (g * g).mean(dim=1) + 1e-30
        rng = pst["row_range"].view(-1, 2)
        for i in diff:
            lo, hi = rng[i // 64].tolist()
            x = (torch.log2(r[i]).item() - lo) * 255 / (hi - lo)
            out.append((name, i, i // 64, int(pst["row_q"][i]), int(full[i]), x, lo, hi))
        out.append((name, "rows", full.numel(), "range shape", tuple(rng.shape)))
    return out


if __name__ == "__main__":
    for row in run_ranks(probe, 2, backend="nccl", timeout_s=300, collective_timeout_s=60)[0]:
        print(*row)
