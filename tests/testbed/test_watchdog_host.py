"""The watchdog on a testbed host that booted from the fleet's real user data: the host's
network namespace carries EC2's metadata address (169.254.169.254 on its loopback) with a
stand-in metadata service there (fake_imds_tags.py, the one stand-in the project allows), and
the testbed's own stand-in `shutdown` first on the PATH the user data gets (testbed/boot.py:
it records its call and ends nothing, since a testbed host's shutdown would be this machine's).
A minute lasts a few seconds here (TRANSIENTVOD_WATCHDOG_MINUTE_SECONDS, for tests only); the
2-minute floor users get holds as it is.

(a) While the head's heartbeat changes, the watchdog ends nothing, across twice its limit.
(b) Once it stops changing, the stand-in is called, and not before the limit."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import TRANSIENTVOD
from fake_imds_tags import set_tag
from testbed_support import require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.spot.provisioning.watchdog import HEARTBEAT_TAG, MINUTE_SECONDS_ENV
from transientvod.testbed.boot import boot, shutdown_calls

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


class Head:
    """The fleet's part: a new heartbeat every half second, on a thread, until stopped."""

    def __init__(self, tags_dir: Path):
        self.tags_dir = tags_dir
        self.last_beat_at = time.monotonic()
        set_tag(tags_dir, HEARTBEAT_TAG, "0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        beat = 0
        while not self._stop.wait(0.5):
            beat += 1
            self.last_beat_at = time.monotonic()  # before the write: the watchdog can read it no earlier
            set_tag(self.tags_dir, HEARTBEAT_TAG, str(beat))

    def die(self) -> float:
        """Stops beating; when the last heartbeat was written."""
        self._stop.set()
        self._thread.join(timeout=10)
        return self.last_beat_at


def test_the_watchdog_ends_nothing_while_the_heartbeat_changes_and_shuts_down_once_it_stops(
        testbed_factory, tmp_path, monkeypatch):
    record = testbed_factory(2)
    _, h2 = record.layout.hosts
    tags_dir = tmp_path / "tags"
    tags_dir.mkdir()
    script = user_data(tmp_path, record.directory / "id_ed25519.pub")
    service = metadata_service(h2.name, tags_dir)
    head = Head(tags_dir)  # beating from before the boot: the boot may well take longer than the limit
    try:
        # What boot runs inherits this environment, as cloud-init's user data has its own.
        monkeypatch.setenv(MINUTE_SECONDS_ENV, str(SECONDS_PER_MINUTE))
        output = boot(record.name, h2.name, script)
        assert "watchdog started: 2 min without the head's heartbeat shut this instance down" in output, output
        assert "ready: sshd runs" in output, output

        # (a) The head beats on for twice the limit after the boot: nothing ends.
        deadline = time.monotonic() + 2 * LIMIT_SECONDS
        while time.monotonic() < deadline:
            assert shutdown_calls(record.name, h2.name) == []
            assert len(watchdogs_in(h2.name)) == 1
            time.sleep(0.5)

        # (b) The head dies: the stand-in is called once the limit has passed, not before.
        silent_from = head.die()
        deadline = silent_from + LIMIT_SECONDS + 30
        while not shutdown_calls(record.name, h2.name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert shutdown_calls(record.name, h2.name), \
            f"the watchdog called no shutdown within {LIMIT_SECONDS + 30:g} s of silence"
        assert time.monotonic() - silent_from >= LIMIT_SECONDS
        assert shutdown_calls(record.name, h2.name) == ["shutdown -h now"]
        deadline = time.monotonic() + 10
        while watchdogs_in(h2.name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watchdogs_in(h2.name) == []  # it exits once it has shut the instance down
    finally:
        head.die()
        service.terminate()
        service.wait(timeout=10)
