"""The launcher's line to its workers, for hosts that share no disk with it.

Separate VMs have no shared file system. A worker there cannot read the resolved config in the
launcher's run directory, and what rank 0 writes (`metrics.jsonl`, `events.jsonl`,
`summary.json`) would land on whichever host rank 0 was on, some of them revoked by the end.
So when a job has remote hosts, the launcher serves a small HTTP channel on the head, bound to
the head's cluster address (the one the hosts reach it by):

    GET  /config.yaml       the resolved config, as the workers are to see it
    POST /records/NAME      lines appended to NAME in the head's run directory (RECORD_NAMES)
    PUT  /summary.json      the job's summary, written whole

Every request carries the job's token (TOKEN_HEADER): anything else on the cluster network
that finds the port can neither read the config nor write into the run. The token reaches the
workers as a file of mode 0600 on each host (channel/token.py), never through horovodrun's
environment, which every worker's command line shows. The server binds a port of
cluster.head_ports (ports.py), so a firewall can be written for it.

Why a channel of our own rather than MLflow or the checkpoint store: the records must reach
the head with tracking off, and with a local checkpoint directory on a shared mount; the
channel needs neither. The worker's half is `ChannelRecord` (records.py): a thread posts the lines, so the
training loop never waits for the head.
"""
from __future__ import annotations

import os

# What a rank writes when the whole job must stop (the task is unusable or its code raised, the
# checkpoint to resume does not fit): the launcher prints it once and stops horovodrun.
JOB_ERRORS = "job-errors.jsonl"
LAUNCHER_ENV = "TRANSIENTVOD_LAUNCHER"  # set for the launcher's workers: it prints a task's traceback, once
RECORD_NAMES = frozenset({"metrics.jsonl", "events.jsonl", "mlflow-unsent.jsonl", JOB_ERRORS})
SUMMARY_NAME = "summary.json"
CONFIG_PATH = "/config.yaml"
TOKEN_HEADER = "X-Transientvod-Token"
REQUEST_TIMEOUT_SECONDS = 10
RETRY_SECONDS = 1.0
# How long a finishing worker waits for its last lines to reach the head.
FLUSH_SECONDS = float(os.environ.get("TRANSIENTVOD_CHANNEL_FLUSH_SECONDS", "20"))


class ChannelError(RuntimeError):
    """The head's channel cannot be used; one sentence."""


def is_channel_url(text: str) -> bool:
    return str(text).startswith(("http://", "https://"))
