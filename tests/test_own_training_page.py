"""The docs page "Training your own job" (docs/own-training.md, which the README links): its task
file, config and library-mode diff are the files in examples/ as they are, and its commands run
as written (from a folder that holds the checkout's examples/, with the venv's bin first on the
PATH, as `. .venv/bin/activate` gives)."""
from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SECTION = (REPO / "docs" / "own-training.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", SECTION, re.S | re.M)
QUICKSTART = REPO / "examples" / "quickstart"
LIBRARY = REPO / "examples" / "library_mode"


def blocks(kind: str) -> list[str]:
    return [text for language, text in BLOCKS if language == kind]


def test_the_task_file_and_its_config_are_the_quickstart_example_within_40_lines():
    assert blocks("python") == [(QUICKSTART / "task.py").read_text()]
    assert blocks("yaml") == [(QUICKSTART / "config.yaml").read_text()]
    assert len(blocks("python")[0].splitlines()) <= 40


def test_the_library_mode_diff_is_the_two_scripts_as_they_are_within_40_lines():
    a, b = LIBRARY / "train_horovod.py", LIBRARY / "train_transientvod.py"
    diff = "".join(difflib.unified_diff(a.read_text().splitlines(True), b.read_text().splitlines(True),
                                        str(a.relative_to(REPO)), str(b.relative_to(REPO)), n=0))
    assert blocks("diff") == [diff]
    assert len(diff.splitlines()) <= 40


@pytest.mark.slow
def test_every_command_of_the_section_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    commands = [" ".join(block.replace("\\\n", " ").split()) for block in blocks("bash")]
    assert [c.split()[:2] for c in commands] == [["transientvod", "train"]] * 2 + [["horovodrun", "-np"]]
    for command in commands:
        done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    quickstart = json.loads((tmp_path / "runs" / "quickstart" / "summary.json").read_text())
    assert quickstart["steps"] == 300 and quickstart["test_metrics"]["test_accuracy"] > 0.8, quickstart
    assert (tmp_path / "runs" / "library-mode" / "summary.json").exists()
