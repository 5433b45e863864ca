"""The checkpoint package sits low in the house: of the package's other modules it imports
only the boto3 client factory (aws_clients, a leaf), and its own modules import one way
(format <- store <- local, s3 <- __init__)."""
from __future__ import annotations

from pathlib import Path

from conftest import transientvod_imports

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "checkpoint"
# What each module may import from transientvod: modules below it in this package, and the
# boto3 client factory.
ALLOWED = {
    "format": set(),
    "store": {"transientvod.checkpoint.format"},
    "local": {"transientvod.checkpoint.format", "transientvod.checkpoint.store"},
    "s3": {"transientvod.checkpoint.format", "transientvod.checkpoint.store", "transientvod.aws_clients"},
    "__init__": {"transientvod.checkpoint.format", "transientvod.checkpoint.store",
                 "transientvod.checkpoint.local", "transientvod.checkpoint.s3"},
}


def test_every_checkpoint_module_imports_only_the_modules_below_it():
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    assert set(modules) == set(ALLOWED), "a new module: say what it may import"
    for stem, path in modules.items():
        assert transientvod_imports(path) <= ALLOWED[stem], stem
