"""A peer dies while a survivor enqueues ops: the survivor gets HorovodInternalError, never a
hang (tests/probes/peer_death_probe.py; launch/horovod-0.28.1-transient.patch).

Elastic `horovodrun`, because a static job kills every worker as soon as one fails.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, probe_rows

pytestmark = pytest.mark.slow

# Horovod 0.28.1 hung in 2 of the first 4 runs of the probe on this machine, so 4 rounds
# leave an unfixed build little chance to pass.
ROUNDS = 4
ROUND_TIMEOUT_S = 90


def run_round(discovery: Path) -> tuple[list[dict], str]:
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    proc = subprocess.Popen([horovodrun, "-np", "2", "--min-np", "1", "--max-np", "2", "--network-interface", "lo",
                             "--host-discovery-script", str(discovery),
                             sys.executable, str(REPO / "tests" / "probes" / "peer_death_probe.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=ROUND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the survivor hung after its peer died ({ROUND_TIMEOUT_S} s):\n{output[-4000:]}")
    return probe_rows(output), output


def test_a_survivor_enqueueing_as_its_peer_dies_gets_an_error_and_every_handle_completes(tmp_path):
    discovery = tmp_path / "hosts.sh"
    discovery.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discovery.chmod(0o755)
    for round_ in range(ROUNDS):
        rows, output = run_round(discovery)
        assert len(rows) == 1, f"round {round_}: rank 1 reported nothing:\n{output[-4000:]}"
        survivor = rows[0]  # it reported at all: it got the error instead of hanging
        assert survivor["enqueued"] > 100, survivor  # it was enqueueing when rank 0 died
        assert survivor["never_done"] == 0, f"round {round_}: handles that never completed: {survivor}"
