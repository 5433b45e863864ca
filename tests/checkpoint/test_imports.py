"""The checkpoint package sits low in the house: of the package's other modules its stores
import only the boto3 client factory (aws_clients, a leaf), and its own modules import one way
(format <- store <- local, s3, gs <- __init__ <- writer, progress). The shared-disk check reads
the config and asks hosts over SSH (spot's probe), and nothing else here imports it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import assert_package_imports

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "checkpoint"
# What each module may import from transientvod: modules below it in this package, and the
# boto3 client factory.
ALLOWED = {
    "format": set(),
    "store": {"transientvod.checkpoint.format"},
    "local": {"transientvod.checkpoint.format", "transientvod.checkpoint.store"},
    "s3": {"transientvod.checkpoint.format", "transientvod.checkpoint.store", "transientvod.aws_clients"},
    "gs": {"transientvod.checkpoint.format", "transientvod.checkpoint.store"},
    "__init__": {"transientvod.checkpoint.format", "transientvod.checkpoint.store",
                 "transientvod.checkpoint.local", "transientvod.checkpoint.s3", "transientvod.checkpoint.gs"},
    # The newest checkpoint's step and world size, for `transientvod status`: above the stores.
    "progress": {"transientvod.checkpoint", "transientvod.checkpoint.s3"},
    # Rank 0's background writer: any store, through the package's interface.
    "writer": {"transientvod.checkpoint"},
    # Does every host see a local checkpoint.dir: the launcher's marker, probed over SSH.
    "shared_disk": {"transientvod.config", "transientvod.spot.reach.ssh"},
}


def test_every_checkpoint_module_imports_only_the_modules_below_it():
    assert_package_imports(PACKAGE, ALLOWED, heavy_allowed=True)  # the store writes torch state


def test_the_shared_disk_check_loads_no_torch():
    """The launcher runs it before the task is tried (a library-mode job's launcher tries none),
    and the package's __init__ comes with it: torch is imported only where a checkpoint's
    bytes are made or read."""
    code = ("import sys, transientvod.checkpoint.shared_disk, transientvod.head.remote_hosts; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
