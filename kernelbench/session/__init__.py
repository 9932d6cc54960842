"""Running a job, between the harness and a front end: typed requests in, typed outcomes out.

- :mod:`.request`: :class:`RunRequest`, :class:`TrainRequest`, :class:`Outcome` and its
  :class:`Status`, :class:`Listener` (what to show while a session runs).
- :mod:`.options`: from what a user gave (the CLI's options) to a request, every check that
  needs no torch; the default suite.
- :mod:`.plan`: entries checked against the registry and turned into the harness's plan.
- :mod:`.session`: :class:`Session` runs a request into a report folder.
- :mod:`.signals`: SIGTERM / SIGHUP end a run as Ctrl-C does. :mod:`.catalog`: what ``list`` shows.
- :mod:`.ab`: two sides (git revisions or environments) timed in alternating processes of
  ``kernelbench run``, their samples pooled for the verdicts.

It knows the op interface and the registry, never a specific op; the CLI on top parses and
prints. Nothing here imports torch at module level.
"""

from .request import Entry, Listener, Outcome, OutputSettings, RunRequest, Status, TrainRequest
from .session import Session

__all__ = ["Entry", "Listener", "Outcome", "OutputSettings", "RunRequest", "Session", "Status", "TrainRequest"]
