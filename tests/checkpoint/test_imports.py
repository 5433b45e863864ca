"""The checkpoint package sits low in the house: it imports none of the package's other
modules, and its own modules import one way (format <- store <- local, s3 <- __init__)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "checkpoint"
# What each module may import from transientvod: only modules below it in this package.
ALLOWED = {
    "format": set(),
    "store": {"transientvod.checkpoint.format"},
    "local": {"transientvod.checkpoint.format", "transientvod.checkpoint.store"},
    "s3": {"transientvod.checkpoint.format", "transientvod.checkpoint.store"},
    "__init__": {"transientvod.checkpoint.format", "transientvod.checkpoint.store",
                 "transientvod.checkpoint.local", "transientvod.checkpoint.s3"},
}


def transientvod_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found.add(node.module)
    return {name for name in found if name == "transientvod" or name.startswith("transientvod.")}


def test_every_checkpoint_module_imports_only_the_modules_below_it():
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    assert set(modules) == set(ALLOWED), "a new module: say what it may import"
    for stem, path in modules.items():
        assert transientvod_imports(path) <= ALLOWED[stem], stem
