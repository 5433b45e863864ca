"""The launcher's look at a task before horovodrun starts: every mistake that can be seen on
one machine becomes one sentence naming the task file and what to change, instead of the
same traceback from every worker minutes later.

It imports the task, builds its data sets and its model once, builds its optimizer, and runs
one forward pass, the loss and the evaluation on two samples, on the CPU. What only the ring
can see (a model built differently on different ranks) is checked by the workers
(state.TransientState.sync).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import default_collate

from transientvod.config import Config
from transientvod.tasks import Task, TaskError, TaskFailed, load_task


def check_task(config: Config) -> Task:
    """The task the config names, checked; raises TaskError (one sentence) if it is not usable."""
    task = load_task(config)
    torch.manual_seed(config.train.seed)
    train, test = checked_datasets(task, config, config.cluster.max_np)
    model = call(task, "build_model", lambda: task.build_model(config))
    if not isinstance(model, torch.nn.Module):
        raise TaskError(f"build_model in the task {task.source} returned {type(model).__name__}, not a "
                        "torch.nn.Module; return the model to train.")
    if not any(p.requires_grad for p in model.parameters()):
        raise TaskError(f"the model build_model in the task {task.source} returns has no trainable parameters; "
                        "training it would change nothing.")
    call(task, "build_optimizer", lambda: task.optimizer(model, config))
    inputs, target = sample_batch(task, train, "training")
    # As a worker runs a step (train.precision): under autocast where it asks for bf16.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.train.precision == "bf16"):
        output = call(task, "the model's forward pass", lambda: model(inputs))
        loss = call(task, "loss_fn", lambda: task.loss_fn(output, target))
    check_loss(task, loss)
    with torch.no_grad():
        model.eval()
        inputs, target = sample_batch(task, test, "test")
        sums = call(task, "evaluate_batch", lambda: task.evaluate_batch(model(inputs), target))
        check_metric_sums(task, sums)
    return task


def checked_datasets(task: Task, config: Config, world_size: int):
    """(train, test), each a non-empty map-style data set with at least a sample per worker."""
    pair = call(task, "build_datasets", lambda: task.build_datasets(config))
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TaskError(f"build_datasets in the task {task.source} returned {type(pair).__name__}; return a "
                        "pair (train, test) of torch.utils.data.Datasets.")
    for split, dataset in zip(("training", "test"), pair):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TaskError(f"the {split} set build_datasets in the task {task.source} returns is a "
                            f"{type(dataset).__name__} without __getitem__ and __len__; return a map-style "
                            "torch.utils.data.Dataset.")
        size = len(dataset)
        if size < world_size:
            raise TaskError(f"the {split} set build_datasets in the task {task.source} returns has {size} "
                            f"sample(s), fewer than the {world_size} worker(s) the job may run "
                            f"(cluster.max_np); every worker needs at least one.")
    return pair


def sample_batch(task: Task, dataset, split: str):
    """The first two samples (or one) stacked by the default collate, as a worker's loader would."""
    samples = [call(task, f"reading the {split} set", lambda i=i: dataset[i]) for i in range(min(2, len(dataset)))]
    for sample in samples:
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise TaskError(f"the {split} set of the task {task.source} gives a {type(sample).__name__} per "
                            "sample; each sample must be an (input, target) pair.")
    try:
        return default_collate(samples)
    except (TypeError, RuntimeError) as e:
        raise TaskError(f"the {split} set's samples of the task {task.source} do not stack into a batch "
                        f"({e}); give tensors (or numbers, arrays) of the same shape.") from None


def check_loss(task: Task, loss) -> None:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TaskError(f"loss_fn in the task {task.source} returned {shape}, not a scalar tensor; reduce it "
                        "to one number (for example with .mean()).")
    if not loss.requires_grad:
        raise TaskError(f"the loss of the task {task.source} does not depend on the model's parameters "
                        "(it has no gradient); compute it from the model's output.")


def check_metric_sums(task: Task, sums) -> None:
    ok = isinstance(sums, dict) and sums and all(
        isinstance(name, str) and isinstance(value, (int, float, torch.Tensor))
        and (not isinstance(value, torch.Tensor) or value.numel() == 1) for name, value in sums.items())
    if not ok:
        raise TaskError(f"evaluate_batch in the task {task.source} returned {sums!r:.80}; return a dict of "
                        "metric names to sums over the batch, for example {'test_accuracy': number_right}.")


def call(task: Task, what: str, fn: Callable):
    """`fn()`, with anything the task's code raises turned into one sentence."""
    from transientvod.tasks.resnet.data import DataError  # the built-in task's one-sentence errors stay as they are

    try:
        return fn()
    except (TaskError, DataError):
        raise
    except Exception as e:  # noqa: BLE001: the user's code may raise anything
        raise TaskError(str(TaskFailed(what, task.source, e)) + "; fix the task there, or the config it reads.") from None
