"""billing/ sits below spot/ (the fleet imports it) and below the training loop (the job's
books in accounting.py import it): it imports no torch, no horovod, no spot/ and no train,
and its own modules import one way (prices <- meter <- job; budget alone)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import assert_package_imports

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "billing"
# What each module may import from transientvod.
BELOW = {"transientvod.config", "transientvod.aws_clients"}
ALLOWED = {
    "__init__": set(),
    "prices": BELOW,
    "meter": BELOW | {"transientvod.billing.prices"},
    "budget": set(),
    "job": BELOW | {"transientvod.billing.prices", "transientvod.billing.meter"},
}


def test_every_billing_module_imports_only_what_lies_below_it():
    assert_package_imports(PACKAGE, ALLOWED)


def test_importing_billing_loads_neither_torch_nor_horovod_nor_spot():
    code = ("import sys, transientvod.billing.job, transientvod.billing.budget; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod') "
            "or m.startswith(('transientvod.spot', 'transientvod.worker.train'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
