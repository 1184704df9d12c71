"""What a sweep and its trials share: their errors, and the stop signal a process got.

Plain Python, no Optuna or Lightning: `sweep --help` answers before either is imported.
"""

import signal


class SweepError(ValueError):
    """A sweep that cannot start or go on; the message says why and what to change."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or Ctrl-C stopped the sweep; `code` is the exit code (128 + the signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


class _Stop:
    """The stop signal this process received, and whether Lightning handles SIGTERM now."""

    signum: int | None = None
    fitting = False


STOP = _Stop()


def on_signal(signum: int, frame) -> None:
    """Note the signal; stop now, unless Lightning is fitting and stops itself on SIGTERM."""
    STOP.signum = signum
    if STOP.fitting and signum == signal.SIGTERM:
        return  # Lightning ends the fit after the current batch (and saves interrupted.ckpt)
    raise Interrupted(signum)
