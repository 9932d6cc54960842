"""SIGTERM (CI runners, `timeout`) and SIGHUP end a run the way Ctrl-C does: raised as an
interruption, so the report is closed and says what stopped it."""

from __future__ import annotations

import os
import signal
import threading
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


# Seconds between re-sends of a signal whose interruption has not ended the work yet.
RESEND_S = 5.0


class Pending:
    """The signal being delivered, and a timer that sends it again until ``stop()``: the work
    has ended (by the interruption or otherwise) and what follows, closing a report, must not be
    interrupted."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stopped = False
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None

    def arm(self, signum: int) -> None:
        with self.lock:
            self.signum = signum
            if self.timer is None and not self.stopped:
                self.timer = threading.Timer(RESEND_S, self.resend)
                self.timer.daemon = True
                self.timer.start()

    def resend(self) -> None:
        with self.lock:
            self.timer = None
            if self.stopped or self.signum is None:
                return
        os.kill(os.getpid(), self.signum)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None


@contextmanager
def interrupts() -> Iterator[Pending]:
    """SIGTERM and SIGHUP raise Interrupted until the work inside ends.

    An exception raised where Python discards it (a weakref callback or ``__del__`` running when
    the signal lands: "Exception ignored in ...") would leave the work running with nobody left to
    stop it, so the signal is sent again every ``RESEND_S`` seconds until the block is left or the
    yielded ``Pending.stop()`` is called (the work has ended); a signal after that is ignored.
    """
    pending = Pending()

    def handler(signum, frame):
        if pending.stopped:
            return
        pending.arm(signum)
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: leave signals alone
            pass
    try:
        yield pending
    finally:
        pending.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
