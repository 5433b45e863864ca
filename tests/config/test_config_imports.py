"""config/ is the bottom of the house: it imports nothing else of transientvod (no torch, no
horovod), and its own modules import one way (schema <- rules <- load <- __init__)."""
from __future__ import annotations

from pathlib import Path

from conftest import assert_package_imports

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "config"
SCHEMA, RULES, LOAD = "transientvod.config.schema", "transientvod.config.rules", "transientvod.config.load"
ALLOWED = {
    "schema": set(),
    "rules": {SCHEMA},
    "load": {SCHEMA, RULES},
    "__init__": {SCHEMA, RULES, LOAD},
}


def test_every_config_module_imports_only_the_modules_below_it():
    assert_package_imports(PACKAGE, ALLOWED)
