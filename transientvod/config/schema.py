"""The config's schema: every section and key of a training job with its default, the allowed
values, and ConfigError. A YAML file lists only what differs from these defaults (load.py);
rules.py checks the values and how keys relate.

No torch, no horovod, nothing of the package's: this is the bottom of the house (other
modules' tables that a config names, like CODECS and the int8 block range, live here so that
a config is checked before anything expensive is imported).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DATASETS = ("digits", "cifar10", "synthetic")
MODELS = ("resnet",)
LR_SCALING_RULES = ("linear", "none")
LR_SCHEDULES = ("cosine", "constant")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
CODECS = ("none", "fp16", "bf16", "int8")
# The int8 block sizes the kernels accept, the op contract of every backend: the CUDA
# kernels' TV_BLOCK_MIN/MAX (csrc/cuda/compress.cuh; tests/gradients/ops/test_cuda_sources.py compares them)
# and the CPU kernels' stack buffer of INT8_BLOCK_MAX floats. Here, at the bottom of the
# house, so that a config is checked without torch and ops/ and codecs/ import them.
INT8_BLOCK_MIN, INT8_BLOCK_MAX = 256, 1024
SPOT_PROVIDERS = ("none", "trace", "aws", "gce")
SPOT_HOST_NAMES = ("private-dns", "private-ip")  # what aws and gce call a host (spot.host_name)
NOTICE_SOURCES = ("none", "aws", "gce", "hoststate")
# Where a job's servers are billed (billing/ and planner/ read these too).
CLOUDS = ("gce", "aws")
SPOT, ON_DEMAND = "spot", "on-demand"
MARKETS = (SPOT, ON_DEMAND)
# What the head binds for a job with remote hosts, one port each, from cluster.head_ports.
HEAD_SERVICES = ("the job channel", "the MLflow server of a local SQLite store")
# Below Linux's default ephemeral range (32768-60999), where outgoing connections take their
# local ports, so a connection never holds one of these.
HEAD_PORTS_DEFAULT = (30000, 30099)
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
    # DataLoader worker processes per rank, reading samples while the rank trains. null: 2 for a
    # task's data sets (they may read from disk), 0 for the built-in ones (held in memory).
    loader_workers: int | None = None


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
    # bf16: the forward pass and the loss under torch.autocast (CPU or CUDA), backward outside
    # it. A step whose gradient is not finite is skipped on every rank by the exchange's flag
    # (any codec or staleness); plain synchronous fp32 (codec none, staleness 0) applies it.
    precision: str = "fp32"


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
    # [first, last]: the head's services for remote hosts (HEAD_SERVICES) bind the first free
    # ports of this range on the head's cluster address, so a firewall or a security group of
    # the user's own can allow exactly these (docs/network.md).
    head_ports: list = field(default_factory=lambda: list(HEAD_PORTS_DEFAULT))


@dataclass
class ExchangeConfig:
    """How gradients cross the ring (transientvod/gradients/exchange.py). staleness 0 with codec none
    is plain synchronous training through hvd.DistributedOptimizer."""
    staleness: int = 0  # s: the optimizer at step t applies the averaged gradients of step t - s
    codec: str = "none"  # none | fp16 | bf16 | int8 (one fp32 scale per block), with error feedback
    block: int = 512  # int8 elements per scale (256..1024)
    compress_after: float = 0.1  # fraction of train.steps sent uncompressed first (warm-up)
    min_compress_elements: int = 65536  # smaller buckets go uncompressed
    # Gradients travel in buckets cut in backward order; each starts during backward once its
    # gradients are made. Smaller: more overlap, more CPU a step. null: tuned on each ring, which
    # times a third of the gradient (at least 131072 elements) against all of it and keeps the
    # faster (bucket_tuning.py: why); a run too short to time both keeps the staleness's
    # default, at 0 a third, stale all of it (staleness.BACKWARD_BUCKETS).
    bucket_elements: int | None = None
    stale_lr: bool = False  # divide the learning rate by 1 + s
    stale_momentum: bool = True  # while s > 0: momentum (Adam: beta1) - s/(s+1), at least 0 (a delay adds that much of its own)
    sync_warmup: bool = True  # the first optimizer.warmup_steps run at staleness 0, then s


@dataclass
class SpotConfig:
    """Where the job's hosts come from. With a provider, the launcher starts the watcher and
    uses launch/spot_hosts.py as the discovery script."""
    provider: str = "none"  # none (cluster.discovery_script) | trace | aws | gce
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
    # At the job's end (finished, failed, Ctrl-C) the launcher terminates every instance tagged
    # transientvod:job=<job_tag>, as `transientvod down` does (its fleet stops too); false keeps them.
    end_instances_at_exit: bool = True
    # aws and gce
    host_name: str = "private-dns"  # or private-ip; gce: private-dns is the instance's name (internal DNS)
    slots: int = 0  # 0: GPUs per instance (aws: its type's; gce: its guestAccelerators)
    # A running instance joins discovery only once the launcher can log in to it over SSH
    # (spot/reach/gate.py): a fleet's instance takes the key only when its install has finished.
    wait_for_ssh: bool = True
    endpoint_url: str = ""  # the API's base URL ("" = the cloud's own; gce: https://compute.googleapis.com)
    # gce (Compute Engine REST API, Application Default Credentials)
    job_label: str = ""  # the job's name (label transientvod-job=<name>) or key=value
    project: str = ""  # "" means the credentials' project (GOOGLE_CLOUD_PROJECT)
    zone: str = ""  # one zone (instances.list); "" means every zone (aggregatedList)


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
    # The most the whole job may cost, in dollars (servers already running included): as the
    # projected spend reaches it, the job commits, writes a durable checkpoint and ends
    # (docs/budget.md). null: no limit. `train --budget DOLLARS` sets it too.
    budget_usd: float | None = None


@dataclass
class TrackingConfig:
    """MLflow (transientvod/tracking/): the launcher opens and closes the run, rank 0 logs."""
    enabled: bool = True
    uri: str = ""  # "" means $MLFLOW_TRACKING_URI, else sqlite:///<run.output_dir>/mlflow.db
    experiment: str = DEFAULT_EXPERIMENT
    run_id: str = ""  # set by the launcher: the MLflow run whichever process is rank 0 logs into


@dataclass
class Config:
    # The user's training task: a Python file (absolute, or relative to the config file) or an
    # importable module (my_package.my_task) with build_model and build_datasets (tasks/:
    # the contract). "" means the built-in task: the CIFAR ResNet on `data.dataset`.
    task: str = ""
    # The task's own settings, free-form: the task reads them as config.task_settings["key"].
    task_settings: dict = field(default_factory=dict)
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
