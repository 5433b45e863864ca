"""The built-in task: a CIFAR ResNet (models.py) on the config's `data.dataset` (data.py: the
embedded digits, CIFAR-10, or synthetic images), trained with cross-entropy and the config's
SGD, scored by top-1 accuracy: the defaults of tasks/__init__.py. The demo runs it.

A user's task file has the same two functions; this one is a worked example of the contract.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.data import TensorDataset

from transientvod.config import Config
from transientvod.tasks.resnet.data import Dataset, load_dataset
from transientvod.tasks.resnet.models import build_model as build_resnet


@functools.lru_cache(maxsize=2)
def _images(dataset: str, root: str, download: bool, synthetic_samples: int, seed: int) -> Dataset:
    # build_model needs the data's channels and classes: load each data set once per process.
    from transientvod.config import DataConfig
    return load_dataset(DataConfig(dataset=dataset, root=root, download=download,
                                   synthetic_samples=synthetic_samples), seed=seed)


def images(config: Config) -> Dataset:
    d = config.data
    return _images(d.dataset, d.root, d.download, d.synthetic_samples, config.train.seed)


def build_model(config: Config) -> torch.nn.Module:
    data = images(config)
    return build_resnet(config.model, data.in_channels, data.num_classes)


def build_datasets(config: Config) -> tuple[TensorDataset, TensorDataset]:
    data = images(config)
    return TensorDataset(data.train_x, data.train_y), TensorDataset(data.test_x, data.test_y)
