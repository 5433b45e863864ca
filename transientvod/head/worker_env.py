"""The environment horovodrun starts with, and so the one every worker gets.

horovodrun hands its whole environment to every remote worker on the ssh command line
(`ssh HOST 'cd ...; env A=... B=... python ...'`), where any user of the head or of a worker
host can read it with `ps`, and `--verbose` prints it. So the launcher starts horovodrun with
an allow-list: Horovod's, Gloo's and NCCL's settings, this project's own variables, what
Python, the shell and ssh need, the non-secret AWS settings (region, endpoint, profile and
file paths), the Google project and Cloud Storage emulator address, and the tracking URI. Everything else stays in the launcher, cloud credentials
above all: workers read their own (the instance profile, or the file AWS_SHARED_CREDENTIALS_FILE
names), as the issue of the cloud side asks.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

KEPT_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "TMPDIR", "LANG", "LANGUAGE",
    "SSH_AUTH_SOCK",  # a path: horovodrun's own ssh may need the user's agent
    "LD_LIBRARY_PATH", "VIRTUAL_ENV",
    "MLFLOW_TRACKING_URI", "MLFLOW_DISABLE_TELEMETRY", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    # gs:// checkpoints (checkpoint/gs.py): the project, and an emulator's address; workers'
    # credentials are their VM's service account
    "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST",
})
KEPT_PREFIXES = ("HOROVOD_", "GLOO_", "NCCL_", "TRANSIENTVOD_", "PYTHON", "LC_", "NUMBA_", "TORCH_", "CUDA_",
                 "OMPI_", "PMI_",
                 # OpenMP's settings (libgomp's and Intel's, MKL's): thread counts, and how idle
                 # threads wait (OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME).
                 "OMP_", "GOMP_", "KMP_", "MKL_")
# Named in the launcher's warning when present: what a user most likely expected workers to get.
CLOUD_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                     "GOOGLE_APPLICATION_CREDENTIALS", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


def is_kept(name: str) -> bool:
    return name in KEPT_NAMES or name.startswith(KEPT_PREFIXES)


def has_password(url: str) -> bool:
    try:
        return urlsplit(url).password is not None
    except ValueError:  # an unparseable URL: keep it out rather than guess
        return True


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of `environ`; logs once which credentials it left out."""
    kept = {name: value for name, value in environ.items() if is_kept(name)}
    left_out = [name for name in CLOUD_CREDENTIALS if name in environ]
    # A tracking URI with a password would stand on every ssh command line too. Workers do not
    # need it from the environment: the launcher opens the run and puts the store's URI into
    # the resolved config (tracking.uri) that every worker reads.
    if has_password(kept.get("MLFLOW_TRACKING_URI", "")):
        del kept["MLFLOW_TRACKING_URI"]
        left_out.append("MLFLOW_TRACKING_URI (it has a password)")
    if left_out:
        log.warning("%s stay in the launcher: horovodrun would put them on every worker's ssh command line. "
                    "Workers read their own credentials (an instance profile, or AWS_SHARED_CREDENTIALS_FILE).",
                    ", ".join(left_out))
    return kept
