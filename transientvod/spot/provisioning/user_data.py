"""The user data `transientvod fleet` gives each instance: a bash script with which a fresh
server joins the job.

What a worker host needs for horovodrun to start a worker on it over SSH:

- the launcher's public key authorized for the user horovodrun logs in as, and sshd running;
- at the launcher's own venv path, a Python with torch, our patched Horovod and transientvod:
  horovodrun runs `<the launcher's sys.executable> -m transientvod.worker.train` on every host.

Before anything else the script starts the watchdog (spot/watchdog.py, embedded here): an
instance that stops hearing its head's heartbeat for `watchdog_minutes` shuts itself down, also
one whose install below fails or hangs.

The script installs first and authorizes the key last, so a host that accepts the launcher's
key is a host ready to run a worker (an image whose sshd already runs would otherwise let
horovodrun in minutes before Horovod is installed, and the worker would fail there). It is
idempotent (a rebooted instance runs it again; a venv that already has everything is left
alone, which is also how an image with the project baked in boots in seconds), and logs to
/var/log/transientvod-join.log as well as to cloud-init's output.

transientvod comes as its wheel (`pip wheel --no-deps .` in a checkout, or `python -m build`):
from the `s3://` URL it was uploaded to, read with the instance profile's credentials, or as
any requirement pip resolves (transientvod==0.1.0 from an index, an https:// URL of the wheel).
No git checkout: everything the worker runs ships in the wheel. Horovod comes likewise from the
`s3://` URL of the wheel the user built once (`transientvod install-horovod` caches it) and
uploaded; without one, the worker builds it with the installed package's `transientvod
install-horovod`, which takes minutes on every boot.

EC2 takes at most 16 KB of user data (before base64); a script over that is one sentence.
No AWS calls here and no torch: this module only writes text.
"""
from __future__ import annotations

import ast
import base64
import gzip
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from transientvod.spot.provisioning import watchdog

MAX_USER_DATA_BYTES = 16 * 1024  # EC2's limit on user data, before base64 encoding
JOIN_LOG = "/var/log/transientvod-join.log"
WATCHDOG_LOG = "/var/log/transientvod-watchdog.log"
KEY_PATTERN = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-\S+@openssh\.com) [A-Za-z0-9+/=]+( .*)?$")
USER_PATTERN = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
WHEEL_URL = re.compile(r"^s3://[^/]+/.+\.whl$")
S3 = "s3://"
GIT_SOURCE = "git+"  # pip's prefix for a VCS requirement: git+https://host/repo.git[@ref]


class UserDataError(ValueError):
    """Input the join script cannot be made from; one sentence naming what to fix."""


@dataclass(frozen=True)
class JoinSpec:
    """What the join script needs; checked when made."""

    public_key: str  # one line of an OpenSSH .pub file: the launcher's key
    ssh_user: str  # the user horovodrun logs in as (the launcher's own name unless ssh_config says otherwise)
    venv: str  # where the launcher's Python lives: horovodrun runs that same path on every host
    project: str = ""  # transientvod: s3://bucket/key.whl of its wheel, or a pip requirement; "" = the image has it
    horovod_wheel: str = ""  # s3://bucket/key.whl of the patched Horovod wheel; "" = build it at boot
    torch: str = "torch"  # pip requirement of torch: the version the wheel was built against
    region: str = ""  # for the S3 download (the instance's own region)
    python_version: str = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the launcher's: the wheel's ABI
    watchdog_minutes: float = watchdog.DEFAULT_MINUTES  # without the head's heartbeat this long, shut down

    def __post_init__(self):
        object.__setattr__(self, "watchdog_minutes", _checked_minutes(self.watchdog_minutes))
        key = self.public_key.strip()
        if "PRIVATE KEY" in key:
            raise UserDataError("the SSH key given is a private key; give its public half (the .pub file), "
                                "which is all a worker needs.")
        if "\n" in key or not KEY_PATTERN.match(key):
            raise UserDataError("the SSH public key is not one line of an OpenSSH .pub file (ssh-ed25519 AAAA... "
                                "or ssh-rsa AAAA...); give the .pub file of the launcher's key.")
        object.__setattr__(self, "public_key", key)
        if not USER_PATTERN.match(self.ssh_user):
            raise UserDataError(f"the SSH user {self.ssh_user!r} is not a Linux user name; give one such as "
                                "ubuntu or ec2-user with --ssh-user.")
        if not self.venv.startswith("/"):
            raise UserDataError(f"the worker venv {self.venv!r} must be an absolute path (the launcher's venv).")
        if self.horovod_wheel and not WHEEL_URL.match(self.horovod_wheel):
            raise UserDataError(f"the Horovod wheel {self.horovod_wheel!r} must be an s3://bucket/key.whl URL "
                                "(upload the wheel 'transientvod install-horovod' built and cached).")
        if not re.fullmatch(r"3\.\d+", self.python_version):
            raise UserDataError(f"the Python version {self.python_version!r} must look like 3.11.")
        if self.project.startswith(S3) and not WHEEL_URL.match(self.project):
            raise UserDataError(f"the transientvod wheel {self.project!r} must be an s3://bucket/key.whl URL "
                                "(upload the wheel 'pip wheel --no-deps .' built in a checkout).")
        if self.project.startswith(GIT_SOURCE):
            raise UserDataError(f"--project-spec {self.project!r} is a git source, but workers install "
                                "transientvod as a wheel; give the s3:// URL of the wheel 'pip wheel --no-deps .' "
                                "built, or a requirement an index serves (transientvod==VERSION).")


def read_public_key(path: str | Path) -> str:
    """The text of a public key file, or one sentence naming the file to fix."""
    path = Path(path).expanduser()
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise UserDataError(f"the SSH public key {path} does not exist; give the .pub file of the key "
                            "the launcher's ssh uses.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserDataError(f"cannot read the SSH public key {path} ({e}); give a readable .pub file.") from None


def check_size(script: str) -> str:
    """The script, if EC2 takes it as user data."""
    size = len(script.encode())
    if size > MAX_USER_DATA_BYTES:
        raise UserDataError(f"the user data is {size} bytes, over EC2's limit of {MAX_USER_DATA_BYTES}; "
                            "shorten --project-spec or --torch-spec.")
    return script


def join_script(spec: JoinSpec) -> str:
    """The bash script, checked against EC2's size limit."""
    values = "\n".join(f"{name}={shlex.quote(value)}" for name, value in (
        ("SSH_USER", spec.ssh_user), ("VENV", spec.venv), ("PUBLIC_KEY", spec.public_key),
        ("PROJECT", spec.project), ("HOROVOD_WHEEL", spec.horovod_wheel), ("TORCH_SPEC", spec.torch),
        ("REGION", spec.region), ("PYTHON_VERSION", spec.python_version), ("LOG", JOIN_LOG),
        ("WATCHDOG_MINUTES", f"{spec.watchdog_minutes:g}"), ("WATCHDOG_LOG", WATCHDOG_LOG)))
    return check_size(_with_watchdog(SCRIPT.replace("@VALUES@", values)))


def watchdog_script(minutes: float = watchdog.DEFAULT_MINUTES) -> str:
    """The user data of a fleet without the launcher's key (the image brings sshd, the key and
    the project): the watchdog alone."""
    minutes = _checked_minutes(minutes)
    values = "\n".join(f"{name}={shlex.quote(value)}" for name, value in (
        ("LOG", JOIN_LOG), ("WATCHDOG_MINUTES", f"{minutes:g}"), ("WATCHDOG_LOG", WATCHDOG_LOG)))
    return check_size(_with_watchdog(WATCHDOG_ONLY_SCRIPT.replace("@VALUES@", values)))


def _checked_minutes(minutes: float) -> float:
    try:
        return watchdog.check_minutes(minutes)
    except ValueError as e:
        raise UserDataError(str(e)) from None


def _with_watchdog(script: str) -> str:
    return script.replace("@WATCHDOG_STEP@", WATCHDOG_STEP).replace("@WATCHDOG@", watchdog_program())


def watchdog_program() -> str:
    """spot/watchdog.py as the instance gets it: without docstrings and comments (ast.unparse),
    gzipped and in base64, since user data is scarce (16 KB); the readable source is the
    package's. Deterministic: the same package gives the same user data."""
    tree = ast.parse(Path(watchdog.__file__).read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    packed = base64.b64encode(gzip.compress(ast.unparse(tree).encode(), 9, mtime=0)).decode()
    return "\n".join(textwrap.wrap(packed, 76))




SCRIPT = r"""#!/bin/bash
# transientvod: join a job's cluster (EC2 user data written by `transientvod fleet`).
# Installs torch, Horovod and transientvod into $VENV (skipped when they import already), then
# authorizes the launcher's key and starts sshd: a host that takes the key is ready to work.
set -euo pipefail
@VALUES@
mkdir -p "$(dirname "$LOG")"
exec > >(tee -a "$LOG") 2>&1
say() { echo "transientvod-join: $(date -u +%H:%M:%S) $*"; }
die() { say "FAILED: $*"; exit 1; }
trap 'die "line $LINENO exited with $?"' ERR
packages() {  # install OS packages with whichever manager the image has
  if command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
  else  # Red Hat's python3 has venv inside; it has no python3-venv package
    local names=(); for p in "$@"; do [ "$p" = python3-venv ] || names+=("$p"); done
    if command -v dnf >/dev/null; then dnf install -y -q "${names[@]}"
    elif command -v yum >/dev/null; then yum install -y -q "${names[@]}"
    else die "no apt-get, dnf or yum to install $*"; fi
  fi
}
from_s3() {  # from_s3 s3://BUCKET/KEY FILE, with the instance profile's credentials
  say "downloading $1 (the instance profile's credentials)"
  if command -v aws >/dev/null; then
    aws s3 cp ${REGION:+--region "$REGION"} "$1" "$2"
  else
    "$PY" -m pip install -q boto3
    "$PY" - "$1" "$2" "$REGION" <<'PYTHON'
import sys, boto3
bucket, key = sys.argv[1][len("s3://"):].split("/", 1)
boto3.client("s3", region_name=sys.argv[3] or None).download_file(bucket, key, sys.argv[2])
PYTHON
  fi
}
say "joining as $SSH_USER on $(hostname), Python at $VENV"

@WATCHDOG_STEP@
# 1. The user horovodrun logs in as.
id "$SSH_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$SSH_USER"
HOME_DIR=$(getent passwd "$SSH_USER" | cut -d: -f6)
GROUP=$(id -gn "$SSH_USER")

# 2. torch, Horovod and transientvod at the launcher's venv path.
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c 'import torch, horovod.torch, transientvod' 2>/dev/null; then
  say "torch, Horovod and transientvod are installed in $VENV already"
else
  [ -n "$PROJECT" ] || die "$VENV lacks torch, Horovod or transientvod and no project source was given (--project-spec)"
  # The launcher's Python version: the Horovod wheel is built for one ABI.
  BASE=$(command -v "python$PYTHON_VERSION" || command -v python3 || true)
  [ -n "$BASE" ] && "$BASE" -c 'import venv, ensurepip' 2>/dev/null || packages python3 python3-venv
  BASE=$(command -v "python$PYTHON_VERSION" || command -v python3)
  [ "$("$BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PYTHON_VERSION" ] \
    || die "the image has no Python $PYTHON_VERSION (the launcher's); its python3 is $("$BASE" -V 2>&1)"
  [ -x "$PY" ] || "$BASE" -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "$TORCH_SPEC"
  mkdir -p /opt/transientvod
  if [[ "$PROJECT" == s3://* ]]; then  # the wheel, kept under its own name: pip reads what it is from the name
    PROJECT_WHEEL="/opt/transientvod/$(basename "$PROJECT")"
    from_s3 "$PROJECT" "$PROJECT_WHEEL"
    "$PY" -m pip install -q "$PROJECT_WHEEL"
  else
    "$PY" -m pip install -q "$PROJECT"
  fi
  if [ -n "$HOROVOD_WHEEL" ]; then
    WHEEL="/opt/transientvod/$(basename "$HOROVOD_WHEEL")"
    from_s3 "$HOROVOD_WHEEL" "$WHEEL"
    "$PY" -m pip install -q "$WHEEL"
  else
    say "no Horovod wheel given: building it (minutes)"
    TRANSIENTVOD_CACHE=/opt/transientvod/cache "$VENV/bin/transientvod" install-horovod
  fi
  chown -R "$SSH_USER:$GROUP" "$VENV"
  say "installed: $("$PY" -c 'import torch, horovod; print("torch", torch.__version__, "horovod", horovod.__version__)')"
fi

# 3. The launcher's key, last: from now on horovodrun can start workers here.
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || packages openssh-server
install -d -m 700 -o "$SSH_USER" -g "$GROUP" "$HOME_DIR/.ssh"
KEYS="$HOME_DIR/.ssh/authorized_keys"
touch "$KEYS"
grep -qxF "$PUBLIC_KEY" "$KEYS" || echo "$PUBLIC_KEY" >> "$KEYS"
chown "$SSH_USER:$GROUP" "$KEYS" && chmod 600 "$KEYS"

# 4. sshd: through systemd where it runs (the unit is ssh on Debian and Ubuntu, sshd elsewhere).
if [ -d /run/systemd/system ]; then
  systemctl enable --now ssh 2>/dev/null || systemctl enable --now sshd
elif [ -f /run/sshd.pid ] && kill -0 "$(cat /run/sshd.pid)" 2>/dev/null; then
  say "sshd runs already"
else
  ssh-keygen -A
  mkdir -p -m 755 /run/sshd
  "$(command -v sshd || echo /usr/sbin/sshd)"
fi
say "ready: sshd runs and takes the launcher's key for $SSH_USER"
"""

# Step 0 of both scripts; `packages` and `say` are defined before it.
WATCHDOG_STEP = r"""# 0. The watchdog first (spot/watchdog.py): it ends this instance once the head's heartbeat stops.
command -v python3 >/dev/null || packages python3
WATCHDOG_PID=/run/transientvod-watchdog.pid
if [ -f "$WATCHDOG_PID" ] && kill -0 "$(cat "$WATCHDOG_PID")" 2>/dev/null; then
  say "the watchdog runs already"
else
  python3 -c 'import base64,gzip,sys;sys.stdout.buffer.write(gzip.decompress(base64.b64decode(sys.stdin.read())))' \
    > /run/transientvod-watchdog.py <<'TRANSIENTVOD_WATCHDOG'
@WATCHDOG@
TRANSIENTVOD_WATCHDOG
  # Its own session and log: it outlives this script and cloud-init.
  setsid nohup python3 /run/transientvod-watchdog.py --minutes "$WATCHDOG_MINUTES" \
    </dev/null >>"$WATCHDOG_LOG" 2>&1 &
  echo $! > "$WATCHDOG_PID"
  say "watchdog started: $WATCHDOG_MINUTES min without the head's heartbeat shut this instance down"
fi
"""

WATCHDOG_ONLY_SCRIPT = r"""#!/bin/bash
# transientvod: the instance's watchdog alone (EC2 user data written by `transientvod fleet`
# without --ssh-public-key: the image brings sshd, the launcher's key and the project).
set -euo pipefail
@VALUES@
mkdir -p "$(dirname "$LOG")"
exec > >(tee -a "$LOG") 2>&1
say() { echo "transientvod-join: $(date -u +%H:%M:%S) $*"; }
packages() {
  if command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
  elif command -v dnf >/dev/null; then dnf install -y -q "$@"
  else yum install -y -q "$@"; fi
}
@WATCHDOG_STEP@
"""
