"""kernelbench.session.signals: SIGTERM / SIGHUP end the work inside ``interrupts()`` even where
Python discards the exception the signal raised (a ``__del__`` or weakref callback running when
it lands), and nothing interrupts the work's closing once it has ended."""

import os
import signal
import time

import pytest

from kernelbench.session import signals


class RaisesInDel:
    """Takes SIGTERM inside ``__del__``: Python prints "Exception ignored in" and goes on."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here, and its Interrupted is discarded


def _work_until_interrupted(seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the discarded one
def test_an_interruption_python_discarded_is_raised_again(monkeypatch):
    monkeypatch.setattr(signals, "RESEND_S", 0.3)
    previous = signal.getsignal(signal.SIGTERM)
    start = time.monotonic()
    with pytest.raises(signals.Interrupted) as caught:
        with signals.interrupts():
            RaisesInDel()  # dropped at once: the first SIGTERM is lost in its __del__
            _work_until_interrupted(10)
    assert caught.value.signum == signal.SIGTERM
    assert time.monotonic() - start < 5  # the re-sent signal ended the work, not the 10 s
    assert signal.getsignal(signal.SIGTERM) is previous


def test_after_stop_nothing_is_sent_again_or_raised(monkeypatch):
    monkeypatch.setattr(signals, "RESEND_S", 0.2)
    previous = signal.getsignal(signal.SIGTERM)
    with signals.interrupts() as pending:
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            _work_until_interrupted(5)
        pending.stop()  # the work ended: what follows (closing a report) runs to its end
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal now is ignored
        assert _work_until_interrupted(0.6) >= 0.6
    assert signal.getsignal(signal.SIGTERM) is previous
