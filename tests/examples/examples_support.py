"""What the example tests share: the example's own config as Job sections, its task module
loaded from its file, the checks every example job must pass (a host leaves and comes back,
nothing lost), and the trained model loaded back from the job's last durable checkpoint."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

BOTH = "localhost:1,127.0.0.1:1"


def example_config(example: Path, **overrides) -> dict:
    """`example`'s config.yaml as Job sections: its task as an absolute path (the test's copy of
    the config lives elsewhere), each section updated by `overrides`."""
    config = yaml.safe_load((example / "config.yaml").read_text())
    del config["run"]  # Job names the run and its directory
    config["task"] = str(example / config["task"])
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_survived_a_leave(summary: dict, steps: int, task: str) -> None:
    """The job ran all its steps through 2 -> 1 -> 2 workers, lost none, and ran `task`."""
    assert summary["steps"] == steps
    assert summary["world_sizes_seen"] == [2, 1, 2]
    assert summary["steps_lost"] == 0, "a host removed through discovery must not cost steps"
    assert summary["task"] == task


def trained_model(run_dir: Path, steps: int, task):
    """(the job's resolved config, the task's model with the weights of the job's durable
    checkpoint at `steps`, in eval mode): what scores the job's test metrics in one process."""
    from transientvod.checkpoint import open_store
    from transientvod.config import config_from_yaml

    checkpoint = open_store(run_dir / "checkpoints").load_latest()
    assert checkpoint is not None and checkpoint.step == steps
    config = config_from_yaml(checkpoint.config_yaml, "the checkpoint's config")
    model = task.build_model(config)
    model.load_state_dict(checkpoint.state["model"])
    model.eval()
    return config, model
