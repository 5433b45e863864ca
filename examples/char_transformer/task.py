"""A next-character transformer over Python's own standard library sources, trained with AdamW.

    transientvod train --config examples/char_transformer/config.yaml --discovery "python launch/local_hosts.py --hosts localhost:1,127.0.0.1:1"

The same with a host leaving at step 200 and coming back at step 400 (what the test does,
smaller):

    transientvod train --config examples/char_transformer/config.yaml --discovery "python launch/local_hosts.py \
        --phase 0=localhost:1,127.0.0.1:1 --phase 200=localhost:1 --phase 400=localhost:1,127.0.0.1:1 \
        --progress runs/char-transformer/metrics.jsonl"

The text is the first `text_bytes` bytes of the `.py` files beside the `os` module, in sorted
order: every Python install has them, so the example needs no download (the bytes differ
between Python versions, not between runs). Characters are bytes, so the vocabulary is the
256 byte values and needs no tokenizer. A sample is a window of `context` bytes and the same
window shifted by one: the model predicts every next byte at once, as language models train.
The last `test_fraction` of the text is the test split, cut in non-overlapping windows so that
every test byte is scored exactly once.

The job reports `test_loss` (cross-entropy per byte, in nats) and `test_char_accuracy` (how
often the most likely next byte is the right one). For scale, on Python 3.11's sources: guessing
uniformly scores ln 256 = 5.55, knowing only how often each byte occurs 2.86, and always
guessing a space (two bytes in five) is right 39 % of the time. What the config below reaches,
on 4 hosts at staleness 0 and 2: benchmarks/RESULTS.md, "AdamW under staleness".

Settings (`task_settings:` in the config; every key has a default below).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

VOCABULARY = 256  # byte values

DEFAULTS = {
    "text_bytes": 256 * 1024,  # how much of the library's sources to read: the same bytes on every rank
    "context": 64,  # bytes the model sees per sample
    "train_stride": 8,  # bytes between the starts of two training windows (overlapping windows)
    "test_fraction": 0.1,  # the end of the text, held out
    "width": 64,  # the model's embedding width
    "layers": 2,
    "heads": 4,
}


def settings(config) -> dict:
    unknown = set(config.task_settings) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown task_settings {sorted(unknown)}; this task reads {sorted(DEFAULTS)}.")
    return {**DEFAULTS, **config.task_settings}


@functools.lru_cache(maxsize=4)
def library_text(text_bytes: int) -> torch.Tensor:
    """The first `text_bytes` bytes of the standard library's top-level .py files, sorted by name,
    as a uint8 tensor. Only the top level: it holds more than a megabyte on any recent Python,
    and one directory listing is quick to read on every rank."""
    library = Path(os.__file__).parent
    chunks, total = [], 0
    for path in sorted(library.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data[:text_bytes - total])
        total += len(chunks[-1])
        if total >= text_bytes:
            break
    if total < text_bytes:
        raise ValueError(f"the standard library at {library} holds only {total} bytes of .py files; "
                         f"lower task_settings.text_bytes to at most that.")
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


class ByteWindows(Dataset):
    """Windows of `context` bytes every `stride` bytes of `text`: (bytes i..i+context-1, the
    bytes i+1..i+context that follow each of them), as int64 for the embedding and the loss."""

    def __init__(self, text: torch.Tensor, context: int, stride: int):
        if len(text) < context + 1:
            raise ValueError(f"a split of {len(text)} bytes is shorter than one window of {context} + 1.")
        self.text, self.context, self.stride = text, context, stride
        self.count = (len(text) - context - 1) // stride + 1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.count:
            raise IndexError(f"window {index} of {self.count}")
        start = index * self.stride
        window = self.text[start:start + self.context + 1].long()
        return window[:-1], window[1:]


def build_datasets(config) -> tuple[ByteWindows, ByteWindows]:
    s = settings(config)
    text = library_text(int(s["text_bytes"]))
    cut = int(len(text) * (1 - s["test_fraction"]))
    return (ByteWindows(text[:cut], s["context"], s["train_stride"]),
            ByteWindows(text[cut:], s["context"], s["context"]))


class CharTransformer(nn.Module):
    """Byte embedding + learned positions, pre-norm transformer blocks that attend only to
    earlier positions, and a linear read-out to the next byte's logits: (batch, time, 256)."""

    def __init__(self, context: int, width: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02)
        block = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        # enable_nested_tensor only helps padded batches, and warns with norm_first.
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        # Made per call, not kept as a buffer: the loop shares buffers between ranks before each
        # evaluation, and a constant needs no sharing.
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self.embed(tokens) + self.position[:length]
        h = self.blocks(h, mask=causal, is_causal=True)
        return self.head(self.norm(h))


def build_model(config) -> CharTransformer:
    s = settings(config)
    return CharTransformer(s["context"], s["width"], s["layers"], s["heads"])


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # Every position of every window is a prediction: flatten (batch, time) into one axis.
    return F.cross_entropy(output.reshape(-1, VOCABULARY), target.reshape(-1))


def build_optimizer(parameters, config) -> torch.optim.AdamW:
    # Decay the matrices only: decaying biases, LayerNorm gains and the like pulls them to
    # zero for no gain in generalization. The loop scales both groups' rates alike.
    parameters = list(parameters)
    o = config.optimizer
    return torch.optim.AdamW([{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": o.weight_decay},
                              {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}],
                             lr=o.lr, betas=(0.9, 0.99))


def evaluate_batch(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    # Sums over the batch of per-window means: the job divides by the number of windows, and
    # every test window has the same length, so the result is the mean over all test bytes.
    per_byte = F.cross_entropy(output.reshape(-1, VOCABULARY), target.reshape(-1), reduction="none")
    right = (output.argmax(dim=-1) == target).float()
    return {"test_loss": per_byte.view_as(target).float().mean(dim=1).sum(),
            "test_char_accuracy": right.mean(dim=1).sum()}

