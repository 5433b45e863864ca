"""The instance's watchdog (spot/watchdog.py): its rule, and the program against a fake
metadata service (a real HTTP server on loopback, the one stand-in the project allows) with a
stand-in `shutdown` on its PATH. The same program running from the real user data on a
testbed host is tests/testbed/test_watchdog_host.py."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transientvod.spot.provisioning import watchdog
from transientvod.spot.provisioning.watchdog import Heartbeat, check_minutes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))
from fake_imds_tags import FakeImdsTags, stand_in_shutdown  # noqa: E402


def test_a_changing_heartbeat_keeps_the_instance_however_long_it_runs():
    beat = Heartbeat(limit_seconds=600, now=0.0)
    for now in range(0, 100_000, 30):  # a pass every 30 s, for a day and more
        beat.observe(str(1_700_000_000 + now), float(now))
        assert not beat.expired(float(now))


def test_a_heartbeat_that_stops_changing_ends_the_instance_after_the_limit_not_before():
    beat = Heartbeat(limit_seconds=600, now=0.0)
    beat.observe("1700000000", 10.0)
    for now in (20.0, 300.0, 609.0):
        beat.observe("1700000000", now)  # the head's last tag, still served
        assert not beat.expired(now)
    assert beat.expired(610.0)
    assert beat.silent_for(610.0) == 600.0


def test_an_unreachable_metadata_service_is_silence_not_an_ending_at_once():
    beat = Heartbeat(limit_seconds=600, now=0.0)
    beat.observe("1700000000", 0.0)
    beat.observe(None, 1.0)  # unreachable
    assert not beat.expired(1.0) and not beat.expired(599.0)
    beat.observe("1700000300", 500.0)  # back, and the head wrote meanwhile: heard
    assert not beat.expired(1000.0)
    beat.observe(None, 1050.0)
    assert beat.expired(1100.0)  # unreachable for the whole limit since the last new value


def test_the_start_counts_as_hearing_and_clocks_do_not_matter():
    # A tag value from a head whose clock is hours off is still a heartbeat when it changes.
    beat = Heartbeat(limit_seconds=120, now=1000.0)
    assert not beat.expired(1119.0) and beat.expired(1120.0)
    beat = Heartbeat(limit_seconds=120, now=1000.0)
    beat.observe("17", 1100.0)
    assert not beat.expired(1219.0) and beat.expired(1220.0)


@pytest.mark.parametrize("minutes", [1.99, 0, -5, float("nan")])
def test_minutes_under_two_are_one_sentence(minutes):
    with pytest.raises(ValueError) as raised:
        check_minutes(minutes)
    assert str(raised.value) == (f"the watchdog minutes are {minutes!r}; give 2 or more (--watchdog-minutes), since "
                                 "a shorter limit could end an instance whose head is alive.")


def test_the_cli_default_is_the_watchdogs():
    from transientvod.cli.fleet import WATCHDOG_DEFAULT_MINUTES
    assert WATCHDOG_DEFAULT_MINUTES == watchdog.DEFAULT_MINUTES


def run_watchdog(tmp_path, url: str, seconds_per_minute: float) -> subprocess.Popen:
    """The program as the instance runs it, with the stand-in first on its PATH."""
    bin_dir, calls = stand_in_shutdown(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           watchdog.MINUTE_SECONDS_ENV: str(seconds_per_minute)}
    proc = subprocess.Popen([sys.executable, watchdog.__file__, "--minutes", "2", "--metadata-url", url],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, calls


@pytest.mark.slow
def test_the_program_shuts_down_once_the_heartbeat_stops_and_not_while_it_changes(tmp_path):
    with FakeImdsTags("127.0.0.1", 0, tmp_path / "tags") as imds:
        imds.set_heartbeat("1")
        proc, calls = run_watchdog(tmp_path, imds.url, seconds_per_minute=2.5)  # a limit of 5 s
        try:
            for beat in range(2, 22):  # 10 s: twice the limit, a new value every 0.5 s
                time.sleep(0.5)
                silent_from = time.monotonic()  # before the write: the watchdog can read it no earlier
                imds.set_heartbeat(str(beat))
                assert proc.poll() is None and not calls.exists(), proc.stdout.read() if proc.poll() is not None else ""
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out
    assert time.monotonic() - silent_from >= 5.0, out  # not before the limit
    assert calls.read_text().splitlines() == ["shutdown -h now"], out
    assert "heartbeat 21" in out and "s (the limit is 5 s): the head is gone" in out, out
    assert imds.token_puts >= 10  # IMDSv2: a token for every read


def test_the_program_with_no_metadata_service_waits_the_limit_then_shuts_down(tmp_path):
    with FakeImdsTags("127.0.0.1", 0, tmp_path / "tags") as imds:
        url = imds.url  # the port, then nothing listens there
    started = time.monotonic()
    proc, calls = run_watchdog(tmp_path, url, seconds_per_minute=1.0)
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - started >= 2.0, out
    assert proc.returncode == 0 and calls.read_text().splitlines() == ["shutdown -h now"], out
    assert f"no heartbeat from {url}" in out, out


def test_the_program_refuses_minutes_under_two_in_one_sentence(tmp_path):
    done = subprocess.run([sys.executable, watchdog.__file__, "--minutes", "1"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["transientvod-watchdog: the watchdog minutes are 1.0; give 2 or more "
                                                "(--watchdog-minutes), since a shorter limit could end an instance "
                                                "whose head is alive."]
