"""The job a library-mode script runs in: its resolved config and where its records go.

`transientvod train --script my_train.py` writes the resolved config as the task loop's
workers get it, and hands its location to the script's workers in JOB_CONFIG_ENV (a path on a
shared disk, or the launcher's channel URL for hosts that share no disk with it; channel/).
The variable starts with TRANSIENTVOD_, so the worker environment's allow-list keeps it
(worker_env.py). A script started by hand (`horovodrun python my_train.py`) has no launcher:
it runs with the defaults, or with the YAML file the variable names, resolved here.

No torch, no horovod: the launcher imports JOB_CONFIG_ENV.
"""
from __future__ import annotations

import os
import socket

from transientvod.channel.protocol import is_channel_url
from transientvod.channel.records import ChannelRecord, LocalRecord, fetch_config
from transientvod.channel.token import read_token
from transientvod.config import Config, config_from_yaml, load_config

JOB_CONFIG_ENV = "TRANSIENTVOD_JOB_CONFIG"


def job_config(environ=os.environ) -> tuple[Config, object]:
    """The job's config and its record (LocalRecord, or ChannelRecord through the launcher's
    channel): from JOB_CONFIG_ENV when set, else the defaults (a run directory under ./runs)."""
    location = environ.get(JOB_CONFIG_ENV, "")
    if is_channel_url(location):
        from transientvod.checkpoint.shared_disk import check_marker_seen

        token = read_token(environ)
        config = config_from_yaml(fetch_config(location, token), location)
        check_marker_seen(config, environ.get("HOROVOD_HOSTNAME") or socket.gethostname())
        return config, ChannelRecord(location.rsplit("/", 1)[0], token, config.run_dir)
    config = load_config(location or None)
    return config, LocalRecord(config.run_dir)
