"""One dataclass tree for a training job: YAML in, resolved YAML out.

A YAML file lists only what differs from the defaults (schema.py), for example::

    train: {steps: 400, commit_every: 20}
    model: {depth: 8, width: 8}

Unknown keys and wrong types are errors that name the key and the file, because a typo in
a config silently falling back to a default costs a whole paid run. The resolved config (every
key, defaults filled in) is written next to each run's outputs and inside each checkpoint.

This package imports neither torch nor horovod: the CLI validates a config before it starts
anything expensive. schema.py holds the tree and its defaults, rules.py the checks, load.py
the YAML; callers import from `transientvod.config`.
"""
from __future__ import annotations

from transientvod.config.load import (
    config_from_yaml,
    is_task_file,
    load_config,
    to_dict,
    to_yaml,
    write_resolved,
)
from transientvod.config.rules import validate
from transientvod.config.schema import (
    CLOUDS,
    CODECS,
    DATASETS,
    DEFAULT_EXPERIMENT,
    DEFAULT_OUTPUT_DIR,
    DEVICES,
    INT8_BLOCK_MAX,
    INT8_BLOCK_MIN,
    LR_SCALING_RULES,
    LR_SCHEDULES,
    MARKETS,
    MODELS,
    NOTICE_SOURCES,
    ON_DEMAND,
    PRECISIONS,
    SPOT,
    SPOT_HOST_NAMES,
    SPOT_PROVIDERS,
    CheckpointConfig,
    ClusterConfig,
    Config,
    ConfigError,
    CostConfig,
    DataConfig,
    ExchangeConfig,
    ModelConfig,
    NoticeConfig,
    OptimizerConfig,
    RunConfig,
    SpotConfig,
    TrackingConfig,
    TrainConfig,
)

__all__ = [
    "is_task_file",
    "CLOUDS",
    "CODECS",
    "CheckpointConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "CostConfig",
    "DATASETS",
    "DEFAULT_EXPERIMENT",
    "DEFAULT_OUTPUT_DIR",
    "DEVICES",
    "DataConfig",
    "ExchangeConfig",
    "INT8_BLOCK_MAX",
    "INT8_BLOCK_MIN",
    "LR_SCALING_RULES",
    "LR_SCHEDULES",
    "MARKETS",
    "MODELS",
    "ModelConfig",
    "NOTICE_SOURCES",
    "NoticeConfig",
    "ON_DEMAND",
    "PRECISIONS",
    "OptimizerConfig",
    "RunConfig",
    "SPOT",
    "SPOT_HOST_NAMES",
    "SPOT_PROVIDERS",
    "SpotConfig",
    "TrackingConfig",
    "TrainConfig",
    "config_from_yaml",
    "load_config",
    "to_dict",
    "to_yaml",
    "validate",
    "write_resolved",
]
