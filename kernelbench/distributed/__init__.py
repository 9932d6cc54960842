"""Multi-process tools for kernelbench's distributed work; they know no op.

- ``kernelbench.distributed.spawn.run_ranks``: run a function on N local ranks
  (torch.multiprocessing, spawn) with a deadline, so that a hung or dead rank fails the caller
  instead of hanging it.
- ``kernelbench.distributed.launch.launch``: start a worker module on N local GPUs (or CPU ranks
  on Gloo) through ``torch.distributed.run`` and return the JSON its rank 0 wrote; an op that
  times its candidates on several ranks (dist-adamw) imports it.
- ``kernelbench.distributed.worker``: what such a worker needs on every rank (process group,
  interleaved timers, statistics over the slowest rank, element-wise comparison).

Nothing is imported here: importing the launcher stays free of torch.
"""
