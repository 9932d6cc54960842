"""SIGTERM (CI runners, `timeout`) and SIGHUP end a run the way Ctrl-C does: raised as an
interruption, so the report is closed and says what stopped it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP raised as an interruption, so a run closes its report as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interruption_name(exc: KeyboardInterrupt) -> str:
    return signal.Signals(exc.signum).name if isinstance(exc, Interrupted) else "SIGINT"


def interruption_code(name: str) -> int:
    """The shell's exit code for a process ended by signal ``name``: 128 + its number."""
    return 128 + int(signal.Signals[name])


@contextmanager
def interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted; a second one while the report closes is ignored."""
    def handler(signum, frame):
        signal.signal(signum, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: leave signals alone
            pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
