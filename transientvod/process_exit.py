"""`exit_now`: how the `transientvod` command ends, as `sys.exit` would but without Python's
teardown of every loaded module (the workers do not use it yet: train.py says why).

With torch and MLflow loaded (the launcher has both), that teardown takes seconds of CPU and
frees nothing the operating system would not (measured: a process that had imported torch took
1.0-1.1 s from its last line to its end, 0.05 s with os._exit). What a normal exit does that
matters still happens, in the same order: other threads that are not daemons are waited for,
the atexit handlers run (logging's flush, multiprocessing's children), and the standard streams
are flushed.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    """End the process with `code` (None is 0, as for sys.exit)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # CPython's own exit runs exactly these, once
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone (a reader that went away): nothing to keep
            pass
    os._exit(code or 0)
