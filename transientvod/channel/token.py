"""Where the job channel's token travels: files of mode 0600, never a command line.

horovodrun puts its whole environment on every worker's command line (`env A=... python ...`:
the ssh client's argv on the head, the shell's on the host, the local shell's for local slots),
where any user of either machine reads it with `ps`. Horovod 0.28.1 has no other way to hand a
worker anything: its ssh runs with stdin on /dev/null. So the token never enters horovodrun's
environment. Instead:

- the launcher writes it to TOKEN_DIR/<job id>.token under its own home directory (mode 0600),
  which local workers and hosts sharing that home read;
- every remote host gets the same file before horovodrun may start a worker there: the
  discovery command horovodrun runs is wrapped (launch/token_hosts.py), and a remote host is
  listed only once `ssh HOST 'umask 077; cat > FILE'` took the token on its stdin. A host that
  leaves discovery is forgotten, so a new server under its name gets the file again;
- workers get the file's name (TOKEN_FILE_ENV, relative to the home directory: not a secret)
  and read the token from it.

The home directory is the user's own on each host (the password database's), not $HOME:
horovodrun hands every worker the head's $HOME. ssh starts remote commands there too.
"""
from __future__ import annotations

import os
import pwd
import shlex
from pathlib import Path

from transientvod.channel.protocol import ChannelError

TOKEN_FILE_ENV = "TRANSIENTVOD_CHANNEL_TOKEN_FILE"
TOKEN_DIR = ".transientvod/channel-tokens"


class TokenError(ChannelError):
    """A worker cannot read the channel's token; one sentence."""


def home() -> Path:
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def token_file(job_id: str) -> str:
    """The token file's name relative to the home directory, the same on every host."""
    return f"{TOKEN_DIR}/{job_id}.token"


def installed_list(relative: str) -> str:
    """Where the discovery wrapper lists the hosts that hold the token: beside it."""
    return relative.removesuffix(".token") + ".hosts"


def write_token_file(relative: str, token: str) -> Path:
    """The token in `relative` under this host's home, created with mode 0600 (never wider,
    not even for a moment) and renamed into place; returns its path."""
    path = home() / relative
    temporary = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        temporary.unlink(missing_ok=True)
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "w") as f:
            f.write(token)
        os.replace(temporary, path)
    except OSError as e:
        raise TokenError(f"the launcher cannot write the channel's token to {path} ({e.strerror}); its home "
                         "directory must be writable.") from None
    return path


def read_token(environ=os.environ) -> str:
    """The token a worker sends to the channel: read from the file TOKEN_FILE_ENV names."""
    relative = environ.get(TOKEN_FILE_ENV, "")
    if not relative:
        raise TokenError(f"this worker has no channel token file ({TOKEN_FILE_ENV} is not set); start workers "
                         "through 'transientvod train'.")
    path = home() / relative
    try:
        return path.read_text().strip()
    except OSError as e:
        raise TokenError(f"this worker cannot read the channel's token from {path} ({e.strerror}); the launcher "
                         "writes it there over ssh before it lists the host, so the host must keep its home "
                         "directory writable.") from None


def install_command(relative: str) -> str:
    """The shell command that stores stdin as `relative` under the login's home, mode 0600."""
    target = shlex.quote(relative)
    temporary = shlex.quote(relative + ".tmp")
    directory = shlex.quote(os.path.dirname(relative))
    return f"umask 077 && mkdir -p {directory} && cat > {temporary} && mv -f {temporary} {target}"


def install_on(host: str, relative: str, token: str) -> str | None:
    """Write the token to `host` through ssh's stdin; None on success, else what ssh said."""
    from transientvod.spot.reach.ssh import probe

    return probe(host, install_command(relative), stdin=token)


def remove_from(host: str, relative: str) -> str | None:
    """Delete the token file on `host`; None on success, else what ssh said."""
    from transientvod.spot.reach.ssh import probe

    return probe(host, f"rm -f {shlex.quote(relative)}")
