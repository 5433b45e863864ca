"""tracking/ sits below the training side (train, elastic, exchange, accounting, launcher,
cli import it, never the other way) and imports no torch or horovod; its own modules import
one way (names, store <- sender, figure <- run; names, store <- compare)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "transientvod" / "tracking"
NAMES, STORE = "transientvod.tracking.names", "transientvod.tracking.store"
# What each module may import from transientvod.
ALLOWED = {
    "__init__": set(),
    "names": set(),
    "store": {"transientvod.config"},
    "sender": {STORE},
    "figure": {NAMES},
    "run": {"transientvod.config", NAMES, STORE, "transientvod.tracking.sender", "transientvod.tracking.figure"},
    "compare": {"transientvod.config", NAMES, STORE},
}


def imported_modules(path: Path) -> set[str]:
    """Every module a source file names in an import statement (the same walk as
    tests/checkpoint/test_imports.py)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found.add(node.module)
    return found


def test_every_tracking_module_imports_only_what_lies_below_it():
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    assert set(modules) == set(ALLOWED), "a new module: say what it may import"
    for stem, path in modules.items():
        found = imported_modules(path)
        ours = {name for name in found if name == "transientvod" or name.startswith("transientvod.")}
        assert ours <= ALLOWED[stem], stem
        assert not {name.split(".")[0] for name in found} & {"torch", "horovod", "numba"}, stem


def test_importing_tracking_loads_neither_torch_nor_horovod_nor_the_training_side():
    code = ("import sys, transientvod.tracking.run, transientvod.tracking.compare; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod') or m in "
            "('transientvod.train', 'transientvod.elastic', 'transientvod.exchange', 'transientvod.accounting', "
            "'transientvod.launcher', 'transientvod.cli')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
