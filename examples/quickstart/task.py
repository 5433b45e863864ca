"""A task of your own: a small MLP on scikit-learn's digits, trained with AdamW.

    transientvod train --config examples/quickstart/config.yaml
"""
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset


def build_model(config):
    hidden = config.task_settings["hidden"]
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def build_datasets(config):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16  # pixels 0..16 -> 0..1
    y = torch.tensor(digits.target)
    split = len(y) * 4 // 5  # the same split on every host
    return TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])


def build_optimizer(parameters, config):  # optional: the config's SGD is the default
    return torch.optim.AdamW(parameters, lr=config.optimizer.lr, weight_decay=config.optimizer.weight_decay)


def loss_fn(output, target):  # optional: cross-entropy is the default
    return F.cross_entropy(output, target, label_smoothing=0.05)


def evaluate_batch(output, target):  # optional: top-1 accuracy is the default
    return {"test_accuracy": (output.argmax(dim=1) == target).sum(),
            "test_loss": F.cross_entropy(output, target, reduction="sum")}
