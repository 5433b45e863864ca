"""The networks a job trains: the CIFAR ResNets of He et al. 2016 ("Deep Residual Learning for
Image Recognition", section 4.2).

A CIFAR ResNet of depth 6n+2 is a 3x3 convolution (width channels), then three stages of n
basic blocks (two 3x3 convolutions each) with width, 2*width and 4*width channels, then global
average pooling and one linear layer. The first block of stages 2 and 3 halves the feature
map with stride 2. Its shortcut is the paper's option A: identity, subsampled by 2 and padded
with zero channels, so that shortcuts add no parameters (the paper's CIFAR models do this).

Parameter counts (trainable, counted by building the models with `count_parameters`):

- ResNet-32 (depth 32, width 16, 3 input channels, 10 classes): 464,154 (the paper: 0.46M;
  ResNet-20, -44, -56, -110 give 269,722, 658,586, 853,018, 1,727,962: its 0.27M to 1.7M).
- the demo model (depth 8, width 8, 1 input channel, 10 classes): 19,074.

Global average pooling makes the network work on any input of at least 4x4 pixels: 32x32
CIFAR images end in 8x8 feature maps, 8x8 digits in 2x2.

This module imports torch only.
"""
from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
from torch import nn

if typing.TYPE_CHECKING:
    from transientvod.config import ModelConfig


class ZeroPadShortcut(nn.Module):
    """Option-A shortcut: identity, subsampled by `stride`, with zero channels appended.

    No parameters: the extra channels of the block's output get nothing from the shortcut,
    which is what the paper does for CIFAR (option B's 1x1 convolutions would add weights).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.extra_channels = out_channels - in_channels
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        # F.pad pads the last dimensions first: (W left, W right, H top, H bottom, C front, C back).
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, plus the shortcut, then ReLU (the paper's Fig. 2)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = ZeroPadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The CIFAR ResNet of He et al. 2016, section 4.2, with option-A shortcuts."""

    def __init__(self, depth: int = 32, width: int = 16, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth is {depth}; a CIFAR ResNet has depth 6n+2 with n >= 1 "
                             f"(8, 14, 20, 32, 44, 56, 110).")
        for name, value in (("width", width), ("in_channels", in_channels), ("num_classes", num_classes)):
            if value < 1:
                raise ValueError(f"{name} is {value}; it must be at least 1.")
        blocks_per_stage = (depth - 2) // 6
        self.conv = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.stage1 = self._stage(width, width, blocks_per_stage, stride=1)
        self.stage2 = self._stage(width, 2 * width, blocks_per_stage, stride=2)
        self.stage3 = self._stage(2 * width, 4 * width, blocks_per_stage, stride=2)
        self.fc = nn.Linear(4 * width, num_classes)
        self._init_weights()

    @staticmethod
    def _stage(in_channels: int, out_channels: int, num_blocks: int, stride: int) -> nn.Sequential:
        blocks = [BasicBlock(in_channels, out_channels, stride)]
        blocks += [BasicBlock(out_channels, out_channels) for _ in range(num_blocks - 1)]
        return nn.Sequential(*blocks)

    def _init_weights(self) -> None:
        # He et al. initialize convolutions as in their 2015 paper ("Delving deep into
        # rectifiers"): normal with variance 2/fan_in, which keeps ReLU activations at scale.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv(x)))
        x = self.stage3(self.stage2(self.stage1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


MODEL_BUILDERS: dict[str, typing.Callable[..., nn.Module]] = {
    "resnet": CifarResNet,
}


def build_model(cfg: ModelConfig, in_channels: int, num_classes: int) -> nn.Module:
    """The model `cfg.name` names, shaped for the data set's channels and classes."""
    if cfg.name not in MODEL_BUILDERS:
        raise ValueError(f"model.name is {cfg.name!r}; known models are {', '.join(sorted(MODEL_BUILDERS))}.")
    return MODEL_BUILDERS[cfg.name](depth=cfg.depth, width=cfg.width,
                                    in_channels=in_channels, num_classes=num_classes)


def count_parameters(model: nn.Module) -> int:
    """The number of trainable parameters (batch norm's running statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
