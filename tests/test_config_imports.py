"""config/ is the bottom of the house: it imports nothing else of transientvod (no torch, no
horovod), and its own modules import one way (schema <- rules <- load <- __init__)."""
from __future__ import annotations

from pathlib import Path

from conftest import imported_modules, transientvod_imports

PACKAGE = Path(__file__).resolve().parents[1] / "transientvod" / "config"
SCHEMA, RULES, LOAD = "transientvod.config.schema", "transientvod.config.rules", "transientvod.config.load"
ALLOWED = {
    "schema": set(),
    "rules": {SCHEMA},
    "load": {SCHEMA, RULES},
    "__init__": {SCHEMA, RULES, LOAD},
}


def test_every_config_module_imports_only_the_modules_below_it():
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    assert set(modules) == set(ALLOWED), "a new module: say what it may import"
    for stem, path in modules.items():
        assert transientvod_imports(path) <= ALLOWED[stem], stem
        assert not {name.split(".")[0] for name in imported_modules(path)} & {"torch", "horovod", "numba"}, stem
