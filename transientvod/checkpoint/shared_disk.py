"""Does every host see a local checkpoint.dir? Separate VMs share no disk unless the user mounts one.

For a job with remote hosts, a local `checkpoint.dir` must be on a mount every host shares, or
the durable checkpoints land on whichever host rank 0 was on and a restart on new hosts finds
none. Two checks, at both ends:

- `check_checkpoint_reach` (the launcher, before the job): it writes a marker file there and
  asks each host over SSH whether it sees it: a shared mount passes, a private disk is one
  sentence naming s3:// and gs://.
- `check_marker_seen` (a worker, on a host that joined later): the launcher leaves
  LAUNCHER_MARKER in the directory while the job runs; a worker that does not see it is on a
  host that does not share the directory.
"""
from __future__ import annotations

import secrets
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transientvod.config import Config
from transientvod.spot.reach.ssh import MAX_PARALLEL, probe

MARKER_PREFIX = ".transientvod-shared-check-"


class SharedDiskError(RuntimeError):
    """A local checkpoint.dir is not shared with a host that needs it; one sentence."""


def is_local_path(location: str) -> bool:
    """A checkpoint location on a file system (a path or file://), not an object store."""
    scheme = location.split("://", 1)[0].lower() if "://" in location else ""
    return scheme in ("", "file")


def local_path(location: str) -> Path:
    return Path(location.removeprefix("file://")).absolute()


def _sees(host: str, marker: Path) -> bool:
    return probe(host, f"test -f {shlex.quote(str(marker))}") is None


def hosts_without(directory: Path, remote: list[str]) -> list[str]:
    """The remote hosts that do not see `directory` as this machine does (a marker file in it)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f"{MARKER_PREFIX}{secrets.token_hex(8)}"
    marker.write_text("written by the transientvod launcher to see which hosts share this directory\n")
    try:
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(remote))) as pool:
            seen = list(pool.map(lambda host: _sees(host, marker), remote))
    finally:
        marker.unlink(missing_ok=True)
    return [host for host, sees in zip(remote, seen) if not sees]


def check_checkpoint_reach(config: Config, remote: list[str]) -> None:
    """A local checkpoint.dir must be shared with every remote host; SharedDiskError if not."""
    location = config.checkpoint_dir
    if not remote or not is_local_path(location):
        return
    try:
        missing = hosts_without(local_path(location), remote)
    except OSError as e:
        raise SharedDiskError(f"cannot write to checkpoint.dir {location} ({e.strerror}); choose another.") from None
    if missing:
        others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise SharedDiskError(
            f"checkpoint.dir {location} is on this machine's disk, which host {missing[0]}{others} does not "
            "share, so a restart on new hosts would find no checkpoint; set checkpoint.dir to an s3:// or gs:// "
            "URI, or to a path on a file system every host mounts.")


# Left in a local checkpoint.dir while a job with remote hosts runs: a worker that does not see
# it is on a host that does not share the directory (one that joined after the launch check).
LAUNCHER_MARKER = ".transientvod-launcher"


def check_marker_seen(config: Config, host: str) -> None:
    """A worker's check, on a host reached through the channel; SharedDiskError if this host
    does not share the job's local checkpoint.dir with the launcher."""
    location = config.checkpoint_dir
    if is_local_path(location) and not (local_path(location) / LAUNCHER_MARKER).exists():
        raise SharedDiskError(
            f"checkpoint.dir {location} is on the launcher's disk, which this host ({host}) does not share, so its "
            "checkpoints would be lost with it; set checkpoint.dir to an s3:// or gs:// URI, or to a path on a file "
            "system every host mounts.")
