"""The checks between a config's keys and of their allowed values: each failure is one
ConfigError that names the key, the file and what to write instead."""
from __future__ import annotations

import math
import re
import typing

from transientvod.config.schema import (
    CLOUDS,
    CODECS,
    DATASETS,
    DEVICES,
    HEAD_SERVICES,
    INT8_BLOCK_MAX,
    INT8_BLOCK_MIN,
    LR_SCALING_RULES,
    LR_SCHEDULES,
    MARKETS,
    MODELS,
    NOTICE_SOURCES,
    PRECISIONS,
    SPOT_HOST_NAMES,
    SPOT_PROVIDERS,
    Config,
    ConfigError,
)

# A GCE label, as Compute Engine allows it: key=value or a value alone (under transientvod-job);
# keys start with a lowercase letter, both hold at most 63 lowercase letters, digits, - and _.
GCE_JOB_LABEL = re.compile(r"^([a-z][a-z0-9_-]{0,62}=)?[a-z0-9_-]{1,63}$")
# The object stores a checkpoint.dir may name (checkpoint/s3.py, checkpoint/gs.py), and how
# their URLs are written; each must name its bucket.
OBJECT_STORE_URLS = {"s3": "s3://bucket/prefix", "gs": "gs://bucket/prefix"}


def validate(config: Config, source: str = "config") -> None:
    """Checks between keys and of allowed values; raises ConfigError naming the key."""

    def fail(key: str, why: str) -> typing.NoReturn:
        raise ConfigError(f"{source}: {key} {why}")

    def one_of(key: str, value: str, allowed: tuple) -> None:
        if value not in allowed:
            fail(key, f"is {value!r}; it must be one of {', '.join(allowed)}.")

    one_of("data.dataset", config.data.dataset, DATASETS)
    one_of("model.name", config.model.name, MODELS)
    one_of("optimizer.lr_scaling", config.optimizer.lr_scaling, LR_SCALING_RULES)
    one_of("optimizer.schedule", config.optimizer.schedule, LR_SCHEDULES)
    one_of("train.device", config.train.device, DEVICES)
    one_of("train.precision", config.train.precision, PRECISIONS)
    one_of("exchange.codec", config.exchange.codec, CODECS)
    if not INT8_BLOCK_MIN <= config.exchange.block <= INT8_BLOCK_MAX:
        fail("exchange.block", f"is {config.exchange.block}; an int8 block holds {INT8_BLOCK_MIN} to "
                               f"{INT8_BLOCK_MAX} elements.")
    if not 0.0 <= config.exchange.compress_after <= 1.0:
        fail("exchange.compress_after", f"is {config.exchange.compress_after}; it is a fraction of the steps (0 to 1).")
    check_head_ports(config.cluster.head_ports, fail)
    one_of("spot.provider", config.spot.provider, SPOT_PROVIDERS)
    one_of("notices.source", config.notices.source, NOTICE_SOURCES)
    one_of("cost.cloud", config.cost.cloud, CLOUDS)
    one_of("cost.market", config.cost.market, MARKETS)
    if not config.cost.instance_type.strip():
        fail("cost.instance_type", "is empty; name the type of the worker hosts (gce: k80, p100, v100).")
    budget = config.cost.budget_usd
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        fail("cost.budget_usd", f"is {budget}; set it to the most the job may cost, a positive number of dollars "
             "(or null for no limit).")
    if config.tracking.enabled and not config.tracking.experiment.strip():
        fail("tracking.experiment", "is empty; name the MLflow experiment the run goes into.")
    if config.spot.provider == "aws" and not config.spot.job_tag:
        fail("spot.job_tag", "is empty; set it to the value of the transientvod:job tag on the job's instances.")
    if config.spot.provider in ("aws", "gce"):
        one_of("spot.host_name", config.spot.host_name, SPOT_HOST_NAMES)
    if config.spot.provider == "gce" and not GCE_JOB_LABEL.match(config.spot.job_label):
        fail("spot.job_label", f"is {config.spot.job_label!r}; set it to the job's name (the value of the "
             "transientvod-job label on its instances) or to key=value, in lowercase letters, digits, - and _.")
    scheme, sep, rest = config.checkpoint.dir.partition("://")
    if sep and scheme.lower() in OBJECT_STORE_URLS and not rest.split("/", 1)[0]:
        fail("checkpoint.dir", f"is {config.checkpoint.dir!r}, which names no bucket; write it as "
             f"{OBJECT_STORE_URLS[scheme.lower()]}.")
    if config.data.dataset == "cifar10" and not config.data.root:
        fail("data.root", "is empty; set it to the directory that holds cifar-10-batches-py/.")
    if (config.model.depth - 2) % 6 or config.model.depth < 8:
        fail("model.depth", f"is {config.model.depth}; a CIFAR ResNet has depth 6n+2 (8, 14, 20, 32, 44, 56, 110).")
    positive = {
        "data.batch_size": config.data.batch_size,
        "model.width": config.model.width,
        "optimizer.lr": config.optimizer.lr,
        "train.steps": config.train.steps,
        "train.commit_every": config.train.commit_every,
        "train.checkpoint_every": config.train.checkpoint_every,
        "train.log_every": config.train.log_every,
        "checkpoint.keep_last": config.checkpoint.keep_last,
        "cluster.min_np": config.cluster.min_np,
        "cluster.max_np": config.cluster.max_np,
        "cluster.slots_per_host": config.cluster.slots_per_host,
        "cluster.elastic_timeout": config.cluster.elastic_timeout,
        "spot.stale_after": config.spot.stale_after,
        "spot.poll_seconds": config.spot.poll_seconds,
        "spot.time_scale": config.spot.time_scale,
        "notices.poll_seconds": config.notices.poll_seconds,
    }
    if config.exchange.bucket_elements is not None:  # null: tuned on each ring (bucket_tuning.py)
        positive["exchange.bucket_elements"] = config.exchange.bucket_elements
    for key, value in positive.items():
        if value <= 0:
            fail(key, f"is {value}; it must be greater than 0.")
    non_negative = {
        "optimizer.momentum": config.optimizer.momentum,
        "optimizer.weight_decay": config.optimizer.weight_decay,
        "optimizer.warmup_steps": config.optimizer.warmup_steps,
        "train.eval_every": config.train.eval_every,
        "train.threads_per_worker": config.train.threads_per_worker,
        "cluster.np": config.cluster.np,
        "cluster.reset_limit": config.cluster.reset_limit,
        "cluster.host_cooldown": config.cluster.host_cooldown,
        "exchange.staleness": config.exchange.staleness,
        "exchange.min_compress_elements": config.exchange.min_compress_elements,
        "spot.start_at": config.spot.start_at,
        "spot.notice_seconds": config.spot.notice_seconds,
        "spot.slots": config.spot.slots,
    }
    if config.data.loader_workers is not None:
        non_negative["data.loader_workers"] = config.data.loader_workers
    for key, value in non_negative.items():
        if value < 0:
            fail(key, f"is {value}; it must be 0 or more.")
    if config.train.checkpoint_every % config.train.commit_every:
        fail("train.checkpoint_every", f"is {config.train.checkpoint_every}; it must be a multiple of "
             f"train.commit_every ({config.train.commit_every}) so that a checkpoint holds committed state.")
    c = config.cluster
    if c.min_np > c.max_np:
        fail("cluster.min_np", f"is {c.min_np}, more than cluster.max_np ({c.max_np}); lower min_np or raise max_np.")
    if config.spot.revoke != "kill" and not re.match(r"^vanish:[a-z][a-z0-9]{0,7}$", config.spot.revoke):
        fail("spot.revoke", f"is {config.spot.revoke!r}; it must be kill, or vanish:<testbed name> "
             "(for example vanish:tvd).")
    if c.host_cooldown > 600:
        fail("cluster.host_cooldown", f"is {c.host_cooldown}; it must be 0 (a failed host never rejoins) or at most "
             "600 seconds.")
    if c.np and not c.min_np <= c.np <= c.max_np:
        fail("cluster.np", f"is {c.np}; it must lie between cluster.min_np ({c.min_np}) and cluster.max_np ({c.max_np}).")


def check_head_ports(ports, fail) -> None:
    """cluster.head_ports: [first, last], wide enough for every service the head binds."""
    numbers = len(ports) == 2 and all(isinstance(p, int) and not isinstance(p, bool) for p in ports)
    if not numbers or not 1 <= ports[0] <= ports[1] <= 65535:
        fail("cluster.head_ports", f"is {ports!r}; give [first, last], two port numbers (1 to 65535) with "
                                   "first <= last, for example [30000, 30099].")
    count, needed = ports[1] - ports[0] + 1, len(HEAD_SERVICES)
    if count < needed:
        fail("cluster.head_ports", f"is {ports!r}, {count} port{'s' if count != 1 else ''}, and the head of a job with remote hosts binds "
                                   f"{needed} ({' and '.join(HEAD_SERVICES)}); give a range of at least {needed}.")
