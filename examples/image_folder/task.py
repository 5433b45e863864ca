"""A small CNN on a folder of image files, read one file at a time as the DataLoader asks.

    transientvod train --config examples/image_folder/config.yaml --discovery "python launch/local_hosts.py --hosts localhost:1,127.0.0.1:1"

after writing the images it reads once (or point `task_settings.root` at your own folder):

    python examples/image_folder/make_shapes.py examples/image_folder/data

The folder is laid out as torchvision's ImageFolder expects, one folder per class:

    root/train/<class>/*.png|jpg|jpeg     root/test/<class>/*.png|jpg|jpeg

The data set holds only the file names. Each `__getitem__` opens one file with Pillow, so a
folder far larger than memory trains the same way, and the `data.loader_workers` processes
of each rank decode the next batches while the model trains on this one. Classes are the
training folder's subfolders in sorted order; a test image whose class has no training folder
is an error, not a silently wrong label.

Loss, optimizer and evaluation are the job's defaults: cross-entropy, the config's SGD, and
top-1 accuracy (`test_accuracy`).

Settings (`task_settings:` in the config):
    root        the folder; relative to the folder of this task file, or absolute
    image_size  pixels per side that the model sees; other sizes are resized (default 32)
    width       channels of the CNN's first layer (default 16)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

EXTENSIONS = (".png", ".jpg", ".jpeg")


def settings(config) -> dict:
    s = {"image_size": 32, "width": 16, **config.task_settings}
    if "root" not in s:
        raise ValueError("task_settings has no root; set it to the folder that holds train/ and test/.")
    root = Path(s["root"]).expanduser()
    # Relative to this file, not to the working directory: horovodrun may start a worker in
    # another directory (a remote host's home), and the task file's path is absolute by then.
    s["root"] = root if root.is_absolute() else Path(__file__).parent / root
    return s


def class_names(root: Path) -> list[str]:
    train = root / "train"
    if not train.is_dir():
        raise ValueError(f"{train} is not a folder; task_settings.root must hold train/<class>/ and test/<class>/ "
                         "(examples/image_folder/make_shapes.py writes an example).")
    return sorted(p.name for p in train.iterdir() if p.is_dir())


class ImageFiles(Dataset):
    """(image tensor of 3 x size x size in [-1, 1], class index) per file under folder/<class>/."""

    def __init__(self, folder: Path, classes: list[str], image_size: int):
        unknown = sorted({p.name for p in folder.iterdir() if p.is_dir()} - set(classes)) if folder.is_dir() else []
        if unknown:
            raise ValueError(f"{folder} has classes {unknown} that the training folder lacks.")
        # Sorted: every rank must number the same files alike, since the sampler hands out indices.
        self.files = [(path, label) for label, name in enumerate(classes)
                      for path in sorted((folder / name).glob("*")) if path.suffix.lower() in EXTENSIONS]
        if not self.files:
            raise ValueError(f"{folder} holds no {'/'.join(EXTENSIONS)} files in class folders.")
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[index]
        with Image.open(path) as image:
            image = image.convert("RGB")  # greyscale, palette and RGBA files alike
            if image.size != (self.image_size, self.image_size):
                image = image.resize((self.image_size, self.image_size), Image.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32)
        # (H, W, C) bytes -> (C, H, W) in [-1, 1], the layout and range conv layers train well on.
        return torch.from_numpy(pixels).permute(2, 0, 1) / 127.5 - 1.0, label


def build_datasets(config) -> tuple[ImageFiles, ImageFiles]:
    s = settings(config)
    classes = class_names(s["root"])
    return (ImageFiles(s["root"] / "train", classes, s["image_size"]),
            ImageFiles(s["root"] / "test", classes, s["image_size"]))


def build_model(config) -> nn.Sequential:
    s = settings(config)
    w = s["width"]

    def stage(inputs: int, outputs: int) -> list[nn.Module]:
        # conv, BatchNorm (the loop shares its statistics before every evaluation), ReLU, halve.
        return [nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(),
                nn.MaxPool2d(2)]

    # Three stages, then the mean over the picture: any image_size works.
    return nn.Sequential(*stage(3, w), *stage(w, 2 * w), *stage(2 * w, 4 * w),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, len(class_names(s["root"]))))
