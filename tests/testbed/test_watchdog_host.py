"""The watchdog on a testbed host that booted from the fleet's real user data: the host's
network namespace carries EC2's metadata address (169.254.169.254 on its loopback) with a
stand-in metadata service there (fake_imds_tags.py, the one stand-in the project allows), and
a stand-in `shutdown` first on the PATH the user data gets (it records its call; nothing is
shut down). A minute lasts a few seconds here (TRANSIENTVOD_WATCHDOG_MINUTE_SECONDS, for
tests only); the 2-minute floor users get holds as it is.

(a) While the head's heartbeat changes, the watchdog ends nothing, across twice its limit.
(b) Once it stops changing, the stand-in is called, and not before the limit."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TRANSIENTVOD
from fake_imds_tags import set_tag, stand_in_shutdown
from testbed_support import require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.spot.watchdog import HEARTBEAT_TAG, MINUTE_SECONDS_ENV
from transientvod.testbed.boot import boot

pytestmark = [require_testbed(), pytest.mark.slow]

METADATA_ADDRESS = "169.254.169.254"  # EC2's, inside the host's namespace only
SECONDS_PER_MINUTE = 3.0  # --watchdog-minutes 2: a limit of 6 s
LIMIT_SECONDS = 2 * SECONDS_PER_MINUTE
FAKE_IMDS = Path(__file__).with_name("fake_imds_tags.py")


def user_data(tmp_path, public_key) -> Path:
    done = subprocess.run(TRANSIENTVOD + ["fleet", "--job-tag", "watchdog", "--instance-types", "g4dn.xlarge",
                                          "--target", "1", "--image-id", "ami-12345678", "--ssh-public-key",
                                          str(public_key), "--ssh-user", "root", "--watchdog-minutes", "2",
                                          "--poll-seconds", "10", "--print-user-data"],
                          capture_output=True, text=True, timeout=60, check=True)
    path = tmp_path / "user-data.sh"
    path.write_text(done.stdout)
    return path


def metadata_service(host: str, tags_dir: Path) -> subprocess.Popen:
    """The stand-in at EC2's address and port, inside the host's network namespace."""
    subprocess.run(["ip", "-n", host, "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"], check=True, timeout=30)
    proc = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, str(FAKE_IMDS), "--address",
                             METADATA_ADDRESS, "--port", "80", "--tags-dir", str(tags_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    line = proc.stdout.readline()
    assert line.startswith(f"serving http://{METADATA_ADDRESS}:80"), line + proc.stdout.read()
    return proc


def watchdogs_in(host: str) -> list[int]:
    pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True, timeout=30).stdout.split()
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"/run/transientvod-watchdog.py" in cmdline:
            found.append(int(pid))
    return found


def test_the_watchdog_ends_nothing_while_the_heartbeat_changes_and_shuts_down_once_it_stops(
        testbed_factory, tmp_path, monkeypatch):
    record = testbed_factory(2)
    _, h2 = record.layout.hosts
    tags_dir = tmp_path / "tags"
    tags_dir.mkdir()
    set_tag(tags_dir, HEARTBEAT_TAG, "1")
    bin_dir, calls = stand_in_shutdown(tmp_path)
    script = user_data(tmp_path, record.directory / "id_ed25519.pub")
    service = metadata_service(h2.name, tags_dir)
    try:
        # What boot runs inherits this environment, as cloud-init's user data has its own.
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setenv(MINUTE_SECONDS_ENV, str(SECONDS_PER_MINUTE))
        output = boot(record.name, h2.name, script)
        assert "watchdog started: 2 min without the head's heartbeat shut this instance down" in output, output
        assert "ready: sshd runs" in output, output
        assert len(watchdogs_in(h2.name)) == 1

        # (a) A new heartbeat every half second, for twice the limit: nothing ends.
        for beat in range(2, 2 + int(4 * LIMIT_SECONDS)):
            time.sleep(0.5)
            last_beat_at = time.monotonic()  # before the write: the watchdog can read it no earlier
            set_tag(tags_dir, HEARTBEAT_TAG, str(beat))
            assert not calls.exists(), calls.read_text()
        assert len(watchdogs_in(h2.name)) == 1

        # (b) The head stops: the stand-in is called once the limit has passed, not before.
        silent_from = last_beat_at
        deadline = silent_from + LIMIT_SECONDS + 30
        while not calls.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert calls.exists(), f"the watchdog called no shutdown within {LIMIT_SECONDS + 30:g} s of silence"
        assert time.monotonic() - silent_from >= LIMIT_SECONDS
        assert calls.read_text().splitlines() == ["shutdown -h now"]
        deadline = time.monotonic() + 10
        while watchdogs_in(h2.name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watchdogs_in(h2.name) == []  # it exits once it has shut the instance down
    finally:
        service.terminate()
        service.wait(timeout=10)
