"""`plan`'s cost-against-time picture (planner/figure.py): written by the command, opened here."""
from __future__ import annotations

import subprocess

import numpy as np
from PIL import Image

from conftest import REPO, TRANSIENTVOD


def near(pixels: np.ndarray, colour, tolerance=12) -> int:
    """How many pixels lie within `tolerance` of an RGB colour."""
    return int(np.sum(np.all(np.abs(pixels[..., :3].astype(int) - np.array(colour)) <= tolerance, axis=-1)))


def test_plan_writes_the_picture_with_every_configurations_risk(tmp_path):
    picture = tmp_path / "plans" / "plan.png"
    # A budget some configurations keep and some break: risks from 0 % to 100 %.
    done = subprocess.run(TRANSIENTVOD + ["plan", "--budget", "1.5", "--max-workers", "8", "--runs", "300",
                                          "--figure", str(picture)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert f"wrote {picture}" in done.stdout
    with Image.open(picture) as image:
        assert image.format == "PNG" and image.size == (900, 550)
        pixels = np.asarray(image.convert("RGB"))
    # Points at both ends of the fixed risk scale are drawn (viridis: 0 % dark violet, 100 % yellow),
    # beside the colour bar's own ends.
    zero, hundred = (68, 1, 84), (253, 231, 37)
    bar = pixels[:, int(0.85 * pixels.shape[1]):]  # the colour bar on the right
    plot = pixels[:, :int(0.8 * pixels.shape[1])]
    assert near(bar, zero) > 0 and near(bar, hundred) > 0
    assert near(plot, zero) > 20 and near(plot, hundred) > 20


def test_an_unwritable_picture_is_one_sentence(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(TRANSIENTVOD + ["plan", "--budget", "1.5", "--max-workers", "2", "--runs", "50",
                                          "--figure", str(blocker / "plan.png")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"transientvod: cannot write the picture {blocker / 'plan.png'} (")
    assert lines[0].endswith("); choose another --figure path.")
