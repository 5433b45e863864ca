"""The names a run is recorded under in MLflow: one place, so the writers (run.py, the
training loop's books) and the readers (compare.py, the browser test) cannot drift apart.
The default experiment is a config default (config.DEFAULT_EXPERIMENT)."""

# Params: what the run was (logged once, at the start).
PARAM_MODEL = "model"  # "resnet-8x4": depth x width
PARAM_DATASET = "dataset"
PARAM_CLOUD = "cloud"  # gce | aws
PARAM_INSTANCE_TYPE = "instance_type"
PARAM_MARKET = "market"  # spot | on-demand
PARAM_MIN_WORKERS = "min_workers"
PARAM_MAX_WORKERS = "max_workers"
PARAM_STALENESS = "staleness"
PARAM_CODEC = "codec"
PARAM_LR_RULE = "lr_rule"  # "linear, warm-up 100, cosine"
PARAM_COMMIT_EVERY = "commit_every"
PARAM_CHECKPOINT_EVERY = "checkpoint_every"
PARAM_STEPS = "steps"
PARAM_BATCH_SIZE = "batch_size"

# Tags.
TAG_PROVIDER = "transientvod.provider"  # none | trace | aws
TAG_TRACE = "transientvod.trace"  # the replayed trace file and run, or ""
TAG_GIT_COMMIT = "transientvod.git_commit"  # the checkout's commit, or "unknown" (an installed wheel)
TAG_VERSION = "transientvod.version"  # transientvod.version.__version__
TAG_CONFIGURATION = "transientvod.configuration"  # a short label: "1-2 x k80 spot, s=0 none"

# Metrics by step.
METRIC_LOSS = "train_loss"
METRIC_ACCURACY = "test_accuracy"  # 0..1
METRIC_THROUGHPUT = "samples_per_s"
METRIC_WORKERS = "active_workers"
METRIC_COST = "cost_usd"  # cumulative, what the job's servers have cost so far
METRIC_ON_DEMAND_COST = "on_demand_cost_usd"  # the same server-seconds at on-demand prices
METRIC_REVOCATIONS = "revocations"
METRIC_STEPS_LOST = "steps_lost"

# Metrics logged once, at the end.
METRIC_WALL_HOURS = "wall_hours"
METRIC_SAVINGS_PCT = "savings_pct"  # 100 x (1 - cost / on-demand cost)
METRIC_USD_PER_POINT = "usd_per_accuracy_point"  # cost / (100 x accuracy)

# Artifacts.
ARTIFACT_CONFIG = "config.yaml"
ARTIFACT_SUMMARY = "summary.json"
ARTIFACT_FIGURE = "cost_vs_accuracy.png"
