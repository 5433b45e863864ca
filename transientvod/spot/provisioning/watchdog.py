"""The instance's watchdog: a fleet instance that has not heard from its head for N minutes
shuts itself down, and EC2 terminates it (the fleet launches with
InstanceInitiatedShutdownBehavior=terminate). It covers the head that dies without a word
(SIGKILL, a lost machine, a laptop lid), which no signal handler on the head can.

The heartbeat: every reconcile pass of the fleet (the head) writes the instance tag
`transientvod:heartbeat=<unix time>` on all of the job's live instances in one CreateTags
call, and each instance's first value comes with its launch. The watchdog reads that tag from
the instance-metadata service (IMDSv2, /latest/meta-data/tags/instance/<key>; the fleet
launches with InstanceMetadataTags enabled), which every instance reaches without credentials,
network rules or the head's address.

The rule (`Heartbeat`): the head is heard when the tag's value *changes*, timed by this
instance's own monotonic clock, so a clock that differs between head and instance changes
nothing; the watchdog's start counts as hearing (a fresh or rebooted instance gets the full N
minutes). A metadata service that cannot be reached, or a missing tag, is silence, never an
ending by itself: the instance ends only when N minutes have passed since the value last
changed, the same as a dead head, and a service that answers again with a newer value resets
the count. That errs towards ending: an instance that cannot confirm its head for N minutes
is billing for a job nobody can show is alive.

Why not also count the job's own activity (a worker process of horovodrun here) as a
heartbeat: a worker does not prove a head. sshd notices a client that vanished only by TCP
keepalive, hours later, and a worker whose peers are gone can wait in Gloo or in Horovod's
rendezvous; such a process would keep a head-less instance billing. The fleet's heartbeat
does not depend on the job's progress, so a job that is alive but slow is never ended, and
an instance still installing the project (minutes) is covered from its first second: the join
script starts the watchdog before anything else.

The minutes are the fleet's `--watchdog-minutes` (default 10, at least 2: the fleet writes
the heartbeat every --poll-seconds and EC2 applies a tag change within seconds, so a shorter
limit risks ending an instance of a live head). TRANSIENTVOD_WATCHDOG_MINUTE_SECONDS makes a
minute that many seconds, for tests only.

This file runs on the instance as a script with the system's python3 (the standard library
only: nothing of the project is installed yet when it starts); spot/provisioning/user_data.py embeds it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

HEARTBEAT_TAG = "transientvod:heartbeat"
DEFAULT_MINUTES = 10.0
MIN_MINUTES = 2.0
METADATA_URL = "http://169.254.169.254"
MINUTE_SECONDS_ENV = "TRANSIENTVOD_WATCHDOG_MINUTE_SECONDS"  # tests only: the length of a minute
CHECKS_PER_LIMIT = 10  # how many times per limit the tag is read (at most every MAX_CHECK_SECONDS)
MAX_CHECK_SECONDS = 30.0
REQUEST_TIMEOUT_SECONDS = 2.0
TOKEN_TTL_SECONDS = 60  # a fresh IMDSv2 token for every read: nothing to expire between reads
# What ends the instance, first that exists and exits 0; found on PATH.
SHUTDOWN_COMMANDS = (("shutdown", "-h", "now"), ("poweroff",))


def check_minutes(minutes: float) -> float:
    """The minutes, or ValueError with one sentence naming the setting."""
    if not isinstance(minutes, (int, float)) or not minutes >= MIN_MINUTES:
        raise ValueError(f"the watchdog minutes are {minutes!r}; give {MIN_MINUTES:g} or more (--watchdog-minutes), "
                         "since a shorter limit could end an instance whose head is alive.")
    return float(minutes)


class Heartbeat:
    """When the head was last heard: the time (this instance's monotonic clock) the tag's value
    last changed, or the watchdog's start."""

    def __init__(self, limit_seconds: float, now: float):
        self.limit_seconds = limit_seconds
        self.value: str | None = None
        self.heard_at = now

    def observe(self, value: str | None, now: float) -> None:
        """`value`: the tag as read now, or None when the metadata service gave none
        (unreachable, an error, no such tag): silence, which changes nothing."""
        if value is not None and value != self.value:
            self.value = value
            self.heard_at = now

    def silent_for(self, now: float) -> float:
        return now - self.heard_at

    def expired(self, now: float) -> bool:
        return self.silent_for(now) >= self.limit_seconds


def read_tag(base_url: str, key: str = HEARTBEAT_TAG) -> str | None:
    """The instance tag's value through IMDSv2, or None on any failure (logged)."""
    try:
        token_request = urllib.request.Request(f"{base_url}/latest/api/token", method="PUT",
                                               headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)})
        with urllib.request.urlopen(token_request, timeout=REQUEST_TIMEOUT_SECONDS) as answer:
            token = answer.read().decode()
        tag_request = urllib.request.Request(f"{base_url}/latest/meta-data/tags/instance/{key}",
                                             headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(tag_request, timeout=REQUEST_TIMEOUT_SECONDS) as answer:
            return answer.read().decode().strip() or None
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors; a timeout too
        say(f"no heartbeat from {base_url} ({e})")
        return None


def shut_down() -> str:
    """Run the first shutdown command that exists and succeeds; what ran."""
    for argv in SHUTDOWN_COMMANDS:
        if shutil.which(argv[0]) is None:
            continue
        if subprocess.run(list(argv)).returncode == 0:
            return " ".join(argv)
    raise SystemExit("transientvod-watchdog: neither shutdown nor poweroff worked; the instance keeps running")


def say(text: str) -> None:
    print(f"transientvod-watchdog: {time.strftime('%H:%M:%S', time.gmtime())} {text}", flush=True)


def watch(minutes: float, base_url: str, key: str = HEARTBEAT_TAG, clock=time.monotonic, sleep=time.sleep) -> str:
    """Reads the heartbeat until it has been silent for `minutes`, then shuts down; what ran."""
    minute = float(os.environ.get(MINUTE_SECONDS_ENV) or 60.0)
    limit = check_minutes(minutes) * minute
    period = min(MAX_CHECK_SECONDS, limit / CHECKS_PER_LIMIT)
    heartbeat = Heartbeat(limit, clock())
    say(f"ending this instance after {minutes:g} min ({limit:g} s) without a new {key} from {base_url}")
    while True:
        before = heartbeat.value
        heartbeat.observe(read_tag(base_url, key), clock())
        if heartbeat.value != before:
            say(f"heartbeat {heartbeat.value}")
        if heartbeat.expired(clock()):
            say(f"no new heartbeat for {heartbeat.silent_for(clock()):.0f} s (the limit is {limit:g} s): the head is "
                "gone; shutting down (EC2 then terminates the instance)")
            return shut_down()
        sleep(period)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="shut this instance down when its head stops its heartbeat")
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES)
    parser.add_argument("--metadata-url", default=METADATA_URL)
    parser.add_argument("--tag", default=HEARTBEAT_TAG)
    args = parser.parse_args(argv)
    try:
        ran = watch(args.minutes, args.metadata_url.rstrip("/"), args.tag)
    except ValueError as e:
        print(f"transientvod-watchdog: {e}", file=sys.stderr)
        return 2
    say(f"ran {ran}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
