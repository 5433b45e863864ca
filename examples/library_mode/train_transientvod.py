"""Elastic training of a small MLP on scikit-learn's digits, written as Horovod documents it
(train_horovod.py) and moved to transientvod (train_transientvod.py: docs/library-mode.md).

    transientvod train --config examples/library_mode/config.yaml \
        --script examples/library_mode/train_transientvod.py -- --epochs 20
"""
import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import horovod.torch as hvd
import transientvod

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.05, help="one worker's rate; scaled by the number of workers")
parser.add_argument("--batches-per-commit", type=int, default=10)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)

# The digits (8x8 images, 10 classes): the first 1,500 to train on, the other 297 to test.
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target, dtype=torch.long)
train_set = TensorDataset(x[:1500], y[:1500])
test_x, test_y = x[1500:], y[1500:]

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = transientvod.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=hvd.Compression.none)

sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)


def on_state_reset():
    # Linear scaling: the rate follows the number of workers after hosts leave or join.
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


@torch.no_grad()
def evaluate():
    """Test accuracy; every rank holds the same model."""
    return (model(test_x).argmax(dim=1) == test_y).float().mean().item()


state = transientvod.ElasticState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, args.epochs):
        for state.batch, (data, target) in enumerate(loader, start=state.batch):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            state.sampler.record_batch(state.batch, args.batch_size)
            if state.batch % args.batches_per_commit == 0 or state.commit_requested():
                state.commit()
        state.batch = 0
        state.sampler.set_epoch(state.epoch + 1)  # at the end of the epoch, as Horovod asks
    return evaluate()


accuracy = train(state)
state.finish(test_accuracy=accuracy)
if hvd.rank() == 0:
    print(f"test accuracy {accuracy:.4f}")
