"""The training task: what the user brings to the job, and the checks that turn a mistake in it
into one sentence.

A task is a Python file or an importable module that the config's `task:` names, with:

    build_model(config) -> torch.nn.Module                         required
    build_datasets(config) -> (train, test)                        required: map-style
        torch.utils.data.Datasets of (input, target) pairs (tensors, or what a DataLoader's
        default collate stacks)
    loss_fn(output, target) -> scalar tensor                       optional: cross-entropy
    build_optimizer(parameters, config) -> torch.optim.Optimizer   optional: SGD from `optimizer:`
    evaluate_batch(output, target) -> {name: sum over the batch}   optional: {"test_accuracy":
        the number right}; the job reports each sum over the whole test split, from every
        rank's slice, divided by the split's number of samples

`config` is the job's resolved config (`transientvod.config.Config`); `config.task_settings`
holds the task's own settings, free-form. No task means the built-in one (tasks/resnet/).

The loop (train.py) wraps these in everything else: the gradient exchange, elastic commits,
notices, durable checkpoints, the learning rate following the active workers, the cost meter.
Nothing here imports horovod: the launcher checks a task (check_task) before horovodrun starts.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from transientvod.config import Config, is_task_file

BUILTIN_TASK = "transientvod.tasks.resnet"
REQUIRED = ("build_model", "build_datasets")
OPTIONAL = ("loss_fn", "build_optimizer", "evaluate_batch")
# DataLoader worker processes per rank when data.loader_workers is null: a task's data may be
# read from disk, the built-in data sets are tensors in memory (a worker would only add copies).
TASK_LOADER_WORKERS, BUILTIN_LOADER_WORKERS = 2, 0


class TaskError(ValueError):
    """The task is not usable as given; the message names the file and what to change."""


class TaskFailed(RuntimeError):
    """The task's own code raised while the job ran; `details` is its traceback. The job stops:
    the launcher prints the traceback once and ends horovodrun (train.py, launcher.py)."""

    def __init__(self, what: str, source: str, error: BaseException, kind: str = "task"):
        self.details = "".join(traceback.format_exception(error))
        where = task_frame(error, source)
        super().__init__(f"{what} in the {kind} {source} raised {type(error).__name__}: {error}{where}")


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


def top1_correct(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Default evaluation: how many of the batch the model ranks first correctly."""
    return {"test_accuracy": (output.argmax(dim=1) == target).sum()}


@dataclass(frozen=True)
class Task:
    """A loaded task: the user's functions, or the defaults where the task has none."""

    source: str  # what the config named, for messages
    build_model: Callable
    build_datasets: Callable
    loss_fn: Callable = default_loss
    build_optimizer: Callable | None = None  # None: SGD from the config's optimizer section
    evaluate_batch: Callable = top1_correct
    builtin: bool = False

    def loader_workers(self, config: Config) -> int:
        if config.data.loader_workers is not None:
            return config.data.loader_workers
        return BUILTIN_LOADER_WORKERS if self.builtin else TASK_LOADER_WORKERS

    def optimizer(self, model: torch.nn.Module, config: Config) -> torch.optim.Optimizer:
        """The task's optimizer over `model`'s parameters, or SGD with the config's settings."""
        if self.build_optimizer is None:
            o = config.optimizer
            return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        optimizer = self.build_optimizer(model.parameters(), config)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TaskError(f"build_optimizer in the task {self.source} returned {type(optimizer).__name__}, not a "
                            "torch.optim.Optimizer; return one, for example torch.optim.AdamW(parameters, lr=1e-3).")
        return optimizer


def load_task(config: Config) -> Task:
    """The task `config.task` names (already absolute if a file: config/load.py), imported."""
    source = config.task or BUILTIN_TASK
    module = _import_file(source) if is_task_file(source) else _import_module(source)
    for name in REQUIRED:
        if not callable(getattr(module, name, None)):
            what = {"build_model": "build_model(config) returning the torch.nn.Module to train",
                    "build_datasets": "build_datasets(config) returning the (train, test) data sets"}[name]
            raise TaskError(f"the task {source} has no {name}; define {what}.")
    found = {name: getattr(module, name) for name in OPTIONAL if getattr(module, name, None) is not None}
    for name, value in found.items():
        if not callable(value):
            raise TaskError(f"{name} in the task {source} is a {type(value).__name__}, not a function; "
                            "make it a function or remove it to use the default.")
    return Task(source=source, build_model=module.build_model, build_datasets=module.build_datasets,
                builtin=not config.task, **found)


def _import_file(path: str):
    file = Path(path)
    if not file.is_file():
        raise TaskError(f"the task file {path} does not exist; check `task:` in the config (a relative path "
                        "is relative to the config file).")
    # A task may import modules beside it, as a script would.
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    # Named by its path too: two task files both called task.py stay two modules.
    name = f"transientvod_task_{file.stem}_{hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling (a DataLoader's workers, checkpoints) finds its classes
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001: anything the user's module raises is one sentence
        del sys.modules[name]
        raise TaskError(f"the task file {path} does not import: {type(e).__name__}: {e}"
                        f"{task_frame(e, path)}; fix it there.") from None
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise TaskError(f"the task module {name} is not importable by {sys.executable}; install it on "
                            "every host, or give the task as a file path (my_task.py).") from None
        raise TaskError(f"the task module {name} does not import: {type(e).__name__}: {e}"
                        f"{task_frame(e, name)}; fix it there.") from None
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"the task module {name} does not import: {type(e).__name__}: {e}"
                        f"{task_frame(e, name)}; fix it there.") from None


def task_frame(error: BaseException, source: str) -> str:
    """' (my_task.py, line 12)': the deepest frame of the traceback in the task's own file, or
    its syntax error's line; "" when none is (the error came from inside a library)."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f" ({os.path.basename(error.filename or source)}, line {error.lineno})"
    frames = traceback.extract_tb(error.__traceback__)
    task_file = os.path.abspath(source) if is_task_file(source) else None
    for frame in reversed(frames):
        if (task_file and os.path.abspath(frame.filename) == task_file) or (
                not task_file and not frame.filename.startswith(sys.prefix) and "transientvod" not in frame.filename):
            return f" ({os.path.basename(frame.filename)}, line {frame.lineno})"
    return ""
