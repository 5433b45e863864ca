"""Write a small image folder to train examples/image_folder on: PNGs of four kinds of picture,
one folder per class, a train and a test split.

    python examples/image_folder/make_shapes.py examples/image_folder/data

writes data/train/<class>/<n>.png and data/test/<class>/<n>.png. The classes are horizontal
stripes, vertical stripes, a disc and a square, each in random colours, sizes and places over
noise: a small CNN tells them apart in a few hundred steps, and chance is 1 in 4. The same
seed writes the same images.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("horizontal_stripes", "vertical_stripes", "disc", "square")


def picture(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One size x size RGB picture of `kind`, uint8."""
    background, foreground = rng.integers(0, 256, size=(2, 3))
    while np.abs(background - foreground).sum() < 150:  # keep the shape visible
        foreground = rng.integers(0, 256, size=3)
    rows, cols = np.mgrid[0:size, 0:size]
    if kind in ("horizontal_stripes", "vertical_stripes"):
        period = int(rng.integers(4, 9))
        along = rows if kind == "horizontal_stripes" else cols
        mask = (along + int(rng.integers(0, period))) % period < period // 2
    elif kind == "disc":
        radius = rng.uniform(size * 0.2, size * 0.4)
        cy, cx = rng.uniform(radius, size - radius, size=2)
        mask = (rows - cy) ** 2 + (cols - cx) ** 2 <= radius ** 2
    else:
        side = int(rng.integers(size * 0.35, size * 0.7))
        top, left = rng.integers(0, size - side + 1, size=2)
        mask = (rows >= top) & (rows < top + side) & (cols >= left) & (cols < left + side)
    image = np.where(mask[..., None], foreground, background).astype(np.float32)
    image += rng.normal(0, 12, size=image.shape)  # noise, so no two pictures are alike
    return np.clip(image, 0, 255).astype(np.uint8)


def write_image_folder(root: str | Path, train_per_class: int = 100, test_per_class: int = 25,
                       size: int = 32, seed: int = 0) -> Path:
    """root/{train,test}/<class>/<n>.png; returns root."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for kind in CLASSES:
            folder = root / split / kind
            folder.mkdir(parents=True, exist_ok=True)
            for n in range(count):
                Image.fromarray(picture(kind, size, rng)).save(folder / f"{n:05d}.png")
    return root


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the folder to write (train/ and test/ inside)")
    parser.add_argument("--train-per-class", type=int, default=250)
    parser.add_argument("--test-per-class", type=int, default=50)
    parser.add_argument("--size", type=int, default=32, help="pixels per side")
    args = parser.parse_args(argv)
    root = write_image_folder(args.root, args.train_per_class, args.test_per_class, args.size)
    print(f"wrote {len(CLASSES) * (args.train_per_class + args.test_per_class)} images under {root}")


if __name__ == "__main__":
    main()
