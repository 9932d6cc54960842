"""Multi-process helpers for kernelbench's distributed work.

- ``kernelbench.dist.spawn.run_ranks``: run a function on N local ranks (torch.multiprocessing,
  spawn) with a deadline, so that a hung or dead rank fails the caller instead of hanging it.
- ``kernelbench.dist.bench``: the benchmark worker started by ``torch.distributed.run``.
- ``kernelbench.dist.launch.launch``: starts that worker on N local GPUs (or CPU ranks on Gloo)
  and returns its JSON.

Nothing is imported here, so ``python -m kernelbench.dist.bench`` runs without a stale copy of
itself in ``sys.modules``.
"""
