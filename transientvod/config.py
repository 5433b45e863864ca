"""One dataclass tree for a training job: YAML in, resolved YAML out.

A YAML file lists only what differs from the defaults below, for example::

    train: {steps: 400, commit_every: 20}
    model: {depth: 8, width: 8}

Unknown keys and wrong types are errors that name the key and the file, because a typo in
a config silently falling back to a default costs a whole paid run. The resolved config (every
key, defaults filled in) is written next to each run's outputs and inside each checkpoint.

This module imports neither torch nor horovod: the CLI validates a config before it starts
anything expensive.
"""
from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DATASETS = ("digits", "cifar10", "synthetic")
MODELS = ("resnet",)
LR_SCALING_RULES = ("linear", "none")
LR_SCHEDULES = ("cosine", "constant")
DEVICES = ("auto", "cpu", "cuda")
CODECS = ("none", "fp16", "bf16", "int8")
SPOT_PROVIDERS = ("none", "trace", "aws")
NOTICE_SOURCES = ("none", "aws", "gce", "hoststate")
# Where a job's servers are billed (billing/ and planner/ read these too).
CLOUDS = ("gce", "aws")
SPOT, ON_DEMAND = "spot", "on-demand"
MARKETS = (SPOT, ON_DEMAND)
# Where runs go unless the config says otherwise; `compare` reads the same directory's store.
DEFAULT_OUTPUT_DIR = "runs"
DEFAULT_EXPERIMENT = "transientvod"  # the MLflow experiment, unless tracking.experiment says otherwise


class ConfigError(ValueError):
    """A config the user wrote is wrong; the message says which key, in which file."""


@dataclass
class RunConfig:
    name: str = "run"
    output_dir: str = DEFAULT_OUTPUT_DIR  # the run's outputs go to <output_dir>/<name>/


@dataclass
class DataConfig:
    dataset: str = "digits"  # digits (ships with scikit-learn) | cifar10 | synthetic (tests only)
    root: str = ""  # cifar10: the directory that holds (or will hold) cifar-10-batches-py/
    download: bool = False  # cifar10: fetch the official archive if root lacks it (MD5-checked)
    batch_size: int = 32  # per worker; the global batch grows with the number of workers
    synthetic_samples: int = 512


@dataclass
class ModelConfig:
    name: str = "resnet"
    depth: int = 32  # 6n+2: 32 is ResNet-32 of He et al. 2016 (3 stages x 5 basic blocks)
    width: int = 16  # channels of the first stage; stages have width, 2*width, 4*width


@dataclass
class OptimizerConfig:
    lr: float = 0.1  # the learning rate of ONE worker; the rule below scales it to the active ones
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_scaling: str = "linear"  # linear: lr x active workers (Goyal et al. 2017) | none
    warmup_steps: int = 100  # ramp to a larger scaled lr over this many steps, at start and after growth
    schedule: str = "cosine"  # cosine decay to 0 at train.steps | constant


@dataclass
class TrainConfig:
    steps: int = 64000  # optimizer steps of the whole job, whatever the number of workers
    commit_every: int = 50  # in-memory commit (what survivors roll back to), and host-update check
    checkpoint_every: int = 500  # durable checkpoint by rank 0 (must be a multiple of commit_every)
    eval_every: int = 0  # evaluate on the test split every N steps (0: only at the end)
    log_every: int = 50
    seed: int = 0
    device: str = "auto"  # auto: one GPU per slot (hvd.local_rank()) when CUDA is present, else CPU
    threads_per_worker: int = 0  # 0: the machine's cores divided among its local workers


@dataclass
class CheckpointConfig:
    dir: str = ""  # "" means <run dir>/checkpoints
    keep_last: int = 3


@dataclass
class ClusterConfig:
    min_np: int = 1  # below this many workers, Horovod waits (up to elastic_timeout) for capacity
    max_np: int = 2
    np: int = 0  # workers to start with; 0 means max_np
    slots_per_host: int = 1
    discovery_script: str = ""  # a command that prints `host:slots` lines (Horovod's contract)
    elastic_timeout: int = 60  # seconds Horovod waits for min_np workers after a change
    reset_limit: int = 0  # 0: no limit on the number of resets
    # Horovod finds the network interface common to the hosts by probing at least two of them;
    # name it (eth0, ens5, lo for one machine) to start a job while only one host is up.
    network_interface: str = ""
    # Seconds before a host whose worker failed may rejoin: Horovod blacklists it, then lets it
    # back after 2-3x this, doubling with each failure, up to HOST_COOLDOWN_MAX. A cloud often
    # brings a replacement server back under the same name (GCE's managed groups do). 0: never.
    host_cooldown: int = 5


@dataclass
class ExchangeConfig:
    """How gradients cross the ring (transientvod/exchange.py). staleness 0 with codec none
    is plain synchronous training through hvd.DistributedOptimizer."""
    staleness: int = 0  # s: the optimizer at step t applies the averaged gradients of step t - s
    codec: str = "none"  # none | fp16 | bf16 | int8 (one fp32 scale per block), with error feedback
    block: int = 512  # int8 elements per scale (256..1024)
    compress_after: float = 0.1  # fraction of train.steps sent uncompressed first (warm-up)
    min_compress_elements: int = 65536  # smaller buckets go uncompressed
    stale_lr: bool = False  # divide the learning rate by 1 + s


@dataclass
class SpotConfig:
    """Where the job's hosts come from. With a provider, the launcher starts the watcher and
    uses launch/spot_hosts.py as the discovery script."""
    provider: str = "none"  # none (cluster.discovery_script) | trace | aws
    state_file: str = ""  # "" means <run dir>/hosts.json
    stale_after: float = 30.0  # seconds without a watcher write before discovery reports it stale
    poll_seconds: float = 2.0  # how often the watcher asks the provider
    # trace replay: VM k of the run becomes the k-th of `hosts`
    trace: str = "k80_spot_4workers_vm_trace.csv"  # a file shipped in the package, or a path
    trace_run: str = "1"  # the N-th run of the file, or its run id (us-east1-c-run3)
    hosts: str = ""  # comma-separated local host names; "" means every name of this machine
    time_scale: float = 60.0  # 60: one trace minute per second
    start_at: float = 0.0  # skip this many trace seconds (an uneventful beginning)
    notice_seconds: float = 30.0  # 30 GCE, 120 EC2 (trace seconds, scaled like the rest)
    notices: bool = True  # false: revocations come without notice (hard kills)
    # what a revocation does to its host: kill (SIGKILL its workers) | vanish:<testbed> (the
    # testbed host's link goes down and its processes freeze, as a revoked VM disappears)
    revoke: str = "kill"
    # aws
    job_tag: str = ""  # instances tagged transientvod:job=<job_tag> belong to the job
    region: str = ""
    queue_url: str = ""  # SQS queue fed by the EventBridge interruption/rebalance rules
    host_name: str = "private-dns"  # or private-ip
    slots: int = 0  # 0: GPUs per instance type
    endpoint_url: str = ""


@dataclass
class NoticeConfig:
    """The worker-side watcher of this server's own interruption notice."""
    source: str = "none"  # none | aws (IMDSv2) | gce (metadata) | hoststate (trace replay); the launcher picks hoststate for traces
    poll_seconds: float = 5.0
    url: str = ""  # metadata endpoint override ("" = the cloud's own)


@dataclass
class CostConfig:
    """What the job's servers cost (transientvod/billing/): each host in the ring is billed
    per second at this type's price; the on-demand price of the same type is the yardstick."""
    cloud: str = "gce"  # gce (the study's prices) | aws (on-demand table + spot price history)
    instance_type: str = "k80"  # of every worker host: gce k80|p100|v100; aws p3.2xlarge, g5.xlarge, ...
    market: str = "spot"  # spot | on-demand
    region: str = ""  # aws: "" means spot.region
    zone: str = ""  # aws spot: the availability zone whose spot price history bills the hosts
    always_on: str = ""  # comma-separated types billed on-demand for the whole run (gce: ps)
    price_table: str = ""  # CSV instance_type,on_demand_usd_per_hour overriding the built-in table


@dataclass
class TrackingConfig:
    """MLflow (transientvod/tracking/): the launcher opens and closes the run, rank 0 logs."""
    enabled: bool = True
    uri: str = ""  # "" means $MLFLOW_TRACKING_URI, else sqlite:///<run.output_dir>/mlflow.db
    experiment: str = DEFAULT_EXPERIMENT
    run_id: str = ""  # set by the launcher: the MLflow run whichever process is rank 0 logs into


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    spot: SpotConfig = field(default_factory=SpotConfig)
    notices: NoticeConfig = field(default_factory=NoticeConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or str(self.run_dir / "checkpoints")

    @property
    def host_state_file(self) -> str:
        return self.spot.state_file or str(self.run_dir / "hosts.json")


def load_config(path: str | os.PathLike | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `key.sub=value` overrides."""
    raw: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"config file {source} does not exist; check the path.") from None
        except OSError as e:
            raise ConfigError(f"config file {source} cannot be read ({e.strerror}).") from None
        raw = _parse_yaml(text, source)
    config = _build(Config, raw, source, prefix="")
    for item in overrides:
        _apply_override(config, item)
    validate(config, f"{source} with overrides" if overrides else source)
    return config


def config_from_yaml(text: str, source: str) -> Config:
    """A config from YAML text (for example the copy stored inside a checkpoint)."""
    config = _build(Config, _parse_yaml(text, source), source, prefix="")
    validate(config, source)
    return config


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def write_resolved(config: Config, directory: str | os.PathLike) -> Path:
    """Write the resolved config as <directory>/config.yaml and return its path."""
    out = Path(directory) / "config.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".yaml.tmp")
    tmp.write_text(to_yaml(config))
    os.replace(tmp, out)
    return out


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
    one_of("exchange.codec", config.exchange.codec, CODECS)
    if not 256 <= config.exchange.block <= 1024:
        fail("exchange.block", f"is {config.exchange.block}; an int8 block holds 256 to 1024 elements.")
    if not 0.0 <= config.exchange.compress_after <= 1.0:
        fail("exchange.compress_after", f"is {config.exchange.compress_after}; it is a fraction of the steps (0 to 1).")
    one_of("spot.provider", config.spot.provider, SPOT_PROVIDERS)
    one_of("notices.source", config.notices.source, NOTICE_SOURCES)
    one_of("cost.cloud", config.cost.cloud, CLOUDS)
    one_of("cost.market", config.cost.market, MARKETS)
    if not config.cost.instance_type.strip():
        fail("cost.instance_type", "is empty; name the type of the worker hosts (gce: k80, p100, v100).")
    if config.tracking.enabled and not config.tracking.experiment.strip():
        fail("tracking.experiment", "is empty; name the MLflow experiment the run goes into.")
    if config.spot.provider == "aws" and not config.spot.job_tag:
        fail("spot.job_tag", "is empty; set it to the value of the transientvod:job tag on the job's instances.")
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


# ---------------------------------------------------------------------------------------------
# Building the dataclass tree from plain YAML data, with errors that name the key.

def _parse_yaml(text: str, source: str) -> dict:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source} is not valid YAML{where}; fix the syntax there.") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} must hold a mapping of sections (run:, data:, train:, ...), not a {type(raw).__name__}.")
    return raw


def _build(cls, raw: dict, source: str, prefix: str):
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' {where}; known keys are {', '.join(sorted(known))}.")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        key = prefix + f.name
        typ = hints[f.name]
        value = raw[f.name]
        if dataclasses.is_dataclass(typ):
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{key}' must be a mapping of keys, not {value!r}.")
            values[f.name] = _build(typ, value, source, prefix=key + ".")
        else:
            values[f.name] = _check_type(value, typ, key, source)
    return cls(**values)


def _check_type(value, typ, key: str, source: str):
    allowed = typing.get_args(typ) if isinstance(typ, types.UnionType) else (typ,)
    for t in allowed:
        if t is type(None) and value is None:
            return None
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, str):
            return value
    names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
    raise ConfigError(f"{source}: '{key}' must be {names}, not {value!r} ({type(value).__name__}).")


def _apply_override(config: Config, item: str) -> None:
    """Apply one `section.key=value` override; the value is parsed as YAML (so 3 is an int)."""
    source = f"override '{item}'"
    if "=" not in item:
        raise ConfigError(f"{source} must look like section.key=value, for example train.steps=200.")
    dotted, text = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2:
        raise ConfigError(f"{source} must name a section and a key, for example train.steps=200.")
    section_name, key = parts
    section = getattr(config, section_name, None)
    if section is None or not dataclasses.is_dataclass(section):
        raise ConfigError(f"{source}: unknown section '{section_name}'; known sections are "
                          f"{', '.join(f.name for f in dataclasses.fields(Config))}.")
    value = yaml.safe_load(text) if text.strip() else ""
    rebuilt = _build(type(section), {**dataclasses.asdict(section), key: value}, source, prefix=section_name + ".")
    setattr(config, section_name, rebuilt)
