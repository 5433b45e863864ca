"""tracking/ sits below the training side (train, elastic, exchange, accounting, launcher,
cli import it, never the other way) and imports no torch or horovod; its own modules import
one way (names, store <- sender, figure <- run; names, store <- compare; store <- head_server)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import assert_package_imports

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "tracking"
NAMES, STORE = "transientvod.tracking.names", "transientvod.tracking.store"
# What each module may import from transientvod.
ALLOWED = {
    "__init__": set(),
    "names": set(),
    "store": {"transientvod.config"},
    "sender": {STORE},
    "figure": {NAMES},
    "run": {"transientvod.config", NAMES, STORE, "transientvod.tracking.sender", "transientvod.tracking.figure",
            "transientvod.version"},
    "compare": {"transientvod.config", NAMES, STORE},
    "head_server": {STORE},
}


def test_every_tracking_module_imports_only_what_lies_below_it():
    assert_package_imports(PACKAGE, ALLOWED)


def test_importing_tracking_loads_neither_torch_nor_horovod_nor_the_training_side():
    code = ("import sys, transientvod.tracking.run, transientvod.tracking.compare; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod') or m in "
            "('transientvod.worker.train', 'transientvod.worker.state', 'transientvod.gradients.exchange', 'transientvod.worker.accounting', "
            "'transientvod.head.launcher', 'transientvod.cli')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
