"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

Python's default SIGTERM and SIGHUP end the process at once, without running a single
`finally`: a fleet that `kill`, systemd or a closing SSH session stops would leave every
instance it started running and billing. Inside `ending_signals()`, SIGINT, SIGTERM and SIGHUP
all raise `EndingSignal`, a KeyboardInterrupt, so the one ending path that Ctrl-C already takes
(the fleet's terminate_all, the launcher stopping horovodrun) runs for all three.

Only the first signal raises. A second one, while that ending path runs, is logged and
ignored: raising it would cut the cleanup short (a terminate call half made), which is the
very thing this module exists to prevent. SIGKILL cannot be caught; the instances' own
watchdog (spot/watchdog.py) covers a head that dies that way.

Signal handlers belong to the main thread: elsewhere (a fleet run on a thread of its own)
`ending_signals()` changes nothing, and the program's main thread keeps its own handlers.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger(__name__)

ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class EndingSignal(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: end the job, cleaning up as Ctrl-C does.

    A KeyboardInterrupt, so every `except KeyboardInterrupt` and every `finally` written for
    Ctrl-C handles the other two as well."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process a signal ended: 128 + its number."""
        return 128 + self.signum


@contextlib.contextmanager
def ending_signals(what: str = "this command"):
    """Inside the block, the first SIGINT, SIGTERM or SIGHUP raises EndingSignal in the main
    thread; later ones are logged and ignored until the block is left (its cleanup included).
    A signal ignored before (nohup ignores SIGHUP) stays ignored. The handlers before it come
    back on leaving. `what` names the command in the log line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def on_signal(signum, _frame):
        if received:
            log.warning("%s received %s while ending after %s; it goes on ending (its instances and processes "
                        "first).", what, signal.Signals(signum).name, signal.Signals(received[0]).name)
            return
        received.append(signum)
        raise EndingSignal(signum)

    previous = {}
    for signum in ENDING_SIGNALS:
        # A signal ignored already stays ignored: `nohup transientvod fleet` means the fleet
        # outlives the terminal, and its SIGHUP must not end it.
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
