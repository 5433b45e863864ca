"""The image data a training job learns from, as normalized tensors held in memory.

Three sources, chosen by ``data.dataset`` in the config:

- ``digits``: scikit-learn's handwritten digits (1,797 real 8x8 grey images, 10 classes). It
  ships inside scikit-learn, so it works offline on any machine; the demo and CI train on it.
- ``cifar10``: CIFAR-10 (50,000 + 10,000 colour 32x32 images, 10 classes) read from the
  official python batches in ``<data.root>/cifar-10-batches-py/``. With ``data.download`` the
  official archive is fetched once, its MD5 checked and its members checked before extraction.
- ``synthetic``: class-dependent Gaussian blobs of any size, for unit tests only.

Every source gives fixed train/test splits (the same on every machine and every rank, so that
accuracies of different runs compare) and normalizes both splits with per-channel mean and
standard deviation computed on the train split alone, so that nothing of the test split leaks
into training. Each worker holds the whole train split; which samples it visits is the
sampler's business, not this module's.

This module imports torch and numpy but never horovod: it is used outside training too.
"""
from __future__ import annotations

import codecs
import gzip
import hashlib
import importlib.util
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

try:  # numpy 2 moved these from numpy.core to numpy._core; pickles may name either place
    from numpy._core.multiarray import _reconstruct as _numpy_reconstruct
    from numpy._core.numeric import _frombuffer as _numpy_frombuffer
except ImportError:
    from numpy.core.multiarray import _reconstruct as _numpy_reconstruct
    from numpy.core.numeric import _frombuffer as _numpy_frombuffer

from transientvod.config import DATASETS, DataConfig

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_IMAGE_SHAPE = (3, 32, 32)  # each row of b"data" is the R, G, B planes, each row-major
DOWNLOAD_TIMEOUT_SECONDS = 60  # per blocking read, not for the whole 163 MB

DIGITS_CSV = "datasets/data/digits.csv.gz"  # inside the scikit-learn package
SYNTHETIC_TEST_FRACTION = 0.2


class DataError(ValueError):
    """A data set on disk (or its download) is not usable; the message names the path to fix."""


@dataclass
class Dataset:
    """Both splits of one data set, normalized with statistics of the train split."""

    name: str
    train_x: torch.Tensor  # (N, C, H, W) float32, normalized
    train_y: torch.Tensor  # (N,) int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    # What normalization subtracted and divided by, per channel, on the 0..1 pixel scale:
    # kept so that an image can be shown (or a new one prepared) exactly as training saw it.
    channel_mean: tuple[float, ...] = ()
    channel_std: tuple[float, ...] = ()

    @property
    def in_channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[-1]


def load_dataset(cfg: DataConfig, seed: int = 0) -> Dataset:
    """The data set `cfg.dataset` names; `seed` only draws the synthetic one."""
    if cfg.dataset == "digits":
        return load_digits_dataset()
    if cfg.dataset == "cifar10":
        return load_cifar10(cfg.root, download=cfg.download)
    if cfg.dataset == "synthetic":
        return make_synthetic(cfg.synthetic_samples, seed=seed)
    raise DataError(f"data.dataset is {cfg.dataset!r}; it must be one of {', '.join(DATASETS)}.")


def _normalized_dataset(name: str, train_x: torch.Tensor, train_y: torch.Tensor,
                        test_x: torch.Tensor, test_y: torch.Tensor, num_classes: int) -> Dataset:
    """A Dataset whose two float32 splits are standardized per channel with the train split's statistics.

    Normalizes `train_x` and `test_x` in place: the callers hand over fresh tensors, and the
    CIFAR-10 train split is 600 MB per worker, too much to copy twice on a host of several.
    """
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    # A channel that is constant in the train split would divide by 0; leave its scale alone.
    std = train_x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    for x in (train_x, test_x):
        x.sub_(mean).div_(std)
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y.long(),
        test_x=test_x,
        test_y=test_y.long(),
        num_classes=num_classes,
        channel_mean=tuple(mean.flatten().tolist()),
        channel_std=tuple(std.flatten().tolist()),
    )


# ---------------------------------------------------------------------------------------------
# digits (scikit-learn)

def load_digits_dataset() -> Dataset:
    """scikit-learn's 1,797 handwritten 8x8 digits, split 80/20, stratified, the same everywhere.

    Read from the file scikit-learn ships, without importing scikit-learn: that import (and
    SciPy's under it) costs seconds in the launcher and in every worker of every job. The split
    is scikit-learn's, kept in digits_split.py."""
    from transientvod.tasks.resnet.digits_split import TEST_ROWS, TRAIN_ROWS

    rows = np.loadtxt(digits_csv_path(), delimiter=",", dtype=np.float32)
    images = rows[:, :-1].reshape(-1, 1, 8, 8) / 16.0  # pixel values are 0..16
    labels = rows[:, -1].astype(np.int64)
    train, test = np.array(TRAIN_ROWS), np.array(TEST_ROWS)
    return _normalized_dataset("digits", torch.from_numpy(images[train]), torch.from_numpy(labels[train]),
                               torch.from_numpy(images[test]), torch.from_numpy(labels[test]), num_classes=10)


def digits_csv_path() -> Path:
    """Where the installed scikit-learn keeps its digits (found, not imported)."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0]) / DIGITS_CSV if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise DataError(f"the digits data set ships with scikit-learn and {DIGITS_CSV} was not found in it; "
                        "install scikit-learn (pip install scikit-learn) or choose another data.dataset.")
    return path


# ---------------------------------------------------------------------------------------------
# CIFAR-10 (official python batches)

def load_cifar10(root: str | os.PathLike, download: bool = False) -> Dataset:
    """CIFAR-10 from `<root>/cifar-10-batches-py/`, fetching the official archive first if asked."""
    if not str(root):
        raise DataError(f"data.root is empty; set it to the directory that holds (or will hold) {CIFAR10_DIR}/.")
    root_path = Path(root)
    batches_dir = root_path / CIFAR10_DIR
    if download and not _has_cifar10_batches(batches_dir):
        download_cifar10(root_path, CIFAR10_URL, CIFAR10_MD5)
    if not root_path.is_dir():
        raise DataError(f"CIFAR-10 root directory {root_path} does not exist; set data.root to the "
                        f"directory that holds {CIFAR10_DIR}/, or set data.download to true.")
    if not batches_dir.is_dir():
        raise DataError(f"{batches_dir} does not exist; put the extracted official CIFAR-10 python "
                        f"batches there, or set data.download to true.")
    train = [read_cifar10_batch(batches_dir / name) for name in CIFAR10_TRAIN_BATCHES]
    test_x, test_y = read_cifar10_batch(batches_dir / CIFAR10_TEST_BATCH)
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return _normalized_dataset("cifar10", _pixels_to_unit(train_x), torch.from_numpy(train_y),
                               _pixels_to_unit(test_x), torch.from_numpy(test_y), num_classes=10)


def _has_cifar10_batches(batches_dir: Path) -> bool:
    names = CIFAR10_TRAIN_BATCHES + (CIFAR10_TEST_BATCH,)
    return all((batches_dir / name).is_file() for name in names)


def _pixels_to_unit(images: np.ndarray) -> torch.Tensor:
    # astype copies, which matters: an array unpickled from bytes may be read-only, and torch
    # warns about (and must not write into) those.
    pixels = images.astype(np.float32)
    pixels /= 255.0
    return torch.from_numpy(pixels)


def read_cifar10_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 from one official CIFAR-10 batch file."""
    if not path.is_file():
        raise DataError(f"CIFAR-10 batch file {path} is missing; restore it from the official "
                        f"archive, or delete {path.parent} and set data.download to true.")
    try:
        with open(path, "rb") as f:
            batch = _CifarBatchUnpickler(f).load()
    except OSError as e:
        raise DataError(f"CIFAR-10 batch file {path} cannot be read ({e.strerror or e}); "
                        f"check its permissions.") from None
    except Exception:
        # Garbage bytes make pickle fail in almost any way (its documentation lists no fixed
        # set); none of them says more to the user than "this is not a CIFAR-10 batch".
        raise _not_cifar10_batch(path, "it does not unpickle as one") from None
    return _images_and_labels(batch, path)


def _images_and_labels(batch: object, path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise _not_cifar10_batch(path, 'it is not a dict with keys b"data" and b"labels"')
    data = batch[b"data"]
    per_image = int(np.prod(CIFAR10_IMAGE_SHAPE))
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == per_image):
        raise _not_cifar10_batch(path, f'its b"data" is not a uint8 array of shape (N, {per_image})')
    try:
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (TypeError, ValueError):
        labels = None
    if labels is None or labels.shape != (len(data),) or labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise _not_cifar10_batch(path, f'its b"labels" are not {len(data)} integers from 0 to 9')
    return data.reshape(-1, *CIFAR10_IMAGE_SHAPE), labels


def _not_cifar10_batch(path: Path, why: str) -> DataError:
    return DataError(f"{path} is not an official CIFAR-10 python batch ({why}); replace it with "
                     f"the file of that name from the official archive.")


class _CifarBatchUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR-10 batch holds: a dict of bytes, lists and uint8 arrays.

    A pickle can name any Python callable and have it called; a batch file is data a user
    downloaded, so only the few harmless callables that rebuild arrays and bytes are allowed.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,  # numpy 1, the official files
        ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,  # numpy 2
        ("numpy.core.numeric", "_frombuffer"): _numpy_frombuffer,  # arrays under pickle protocol 5
        ("numpy._core.numeric", "_frombuffer"): _numpy_frombuffer,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,  # bytes as Python 3 writes them under protocol 2
    }

    def __init__(self, file):
        # The official batches were pickled by Python 2: its str keys must stay bytes.
        super().__init__(file, encoding="bytes")

    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR-10 batch") from None


def download_cifar10(root: Path, url: str = CIFAR10_URL, expected_md5: str = CIFAR10_MD5) -> None:
    """Fetch the official archive into `root` (unless a verified copy is there) and extract it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the CIFAR-10 root directory {root} ({e.strerror}); "
                        f"set data.root to a directory you can write to.") from None
    if not os.access(root, os.W_OK):
        raise DataError(f"cannot write into the CIFAR-10 root directory {root}; set data.root to "
                        f"a directory you can write to, or put the batches there by hand.")
    archive = root / CIFAR10_ARCHIVE
    if archive.is_file():
        verify_md5(archive, expected_md5)
    else:
        _fetch(url, archive, expected_md5)
    _extract_into_place(archive, root)


def _fetch(url: str, archive: Path, expected_md5: str) -> None:
    # Download under a unique name and rename only once verified: another worker on the same
    # host may be fetching too, and a cut-off download must never pass for the archive.
    part = tempfile.NamedTemporaryFile(dir=archive.parent, prefix=archive.name, suffix=".part", delete=False)
    try:
        with part, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:
            shutil.copyfileobj(response, part)
        verify_md5(Path(part.name), expected_md5)
        os.replace(part.name, archive)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
        raise DataError(f"downloading {url} failed ({reason}); check the network, or download it "
                        f"by hand into {archive.parent}.") from None
    finally:
        Path(part.name).unlink(missing_ok=True)


def verify_md5(path: Path, expected_md5: str) -> None:
    """Raise DataError unless the file at `path` has the MD5 digest `expected_md5`."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected_md5.lower():
        raise DataError(f"{path} has MD5 {digest.hexdigest()}, not the expected {expected_md5}; it is "
                        f"corrupt or not the official archive: delete it and download again.")


def _extract_into_place(archive: Path, root: Path) -> None:
    # Extract beside the final place, then rename: a worker reading the batches never sees a
    # half-written directory, and of two workers extracting at once the first rename wins.
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".extracting-"))
    try:
        extract_archive(archive, staging)
        if not (staging / CIFAR10_DIR).is_dir():
            raise DataError(f"{archive} holds no {CIFAR10_DIR}/ directory; delete it and download again.")
        try:
            os.rename(staging / CIFAR10_DIR, root / CIFAR10_DIR)
        except OSError:
            # Another worker's rename won (fine), or a broken directory is in the way.
            if not _has_cifar10_batches(root / CIFAR10_DIR):
                raise DataError(f"{root / CIFAR10_DIR} exists but lacks some of the CIFAR-10 batches; "
                                f"delete it and run again.") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def extract_archive(archive: Path, destination: Path) -> None:
    """Extract a .tar.gz into `destination`, refusing it whole if any member could land outside.

    Every member is checked before anything is written: only regular files and directories,
    and no path (absolute, or through "..") that resolves outside `destination`.
    """
    destination = Path(destination).resolve()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, archive, destination)
            # The checks above already refuse what the "data" filter refuses; it stays as a
            # second guard in case a member slips past them.
            tar.extractall(destination, members=members, filter="data")
    except tarfile.FilterError as e:
        raise DataError(f"{archive} holds a member that is unsafe to extract ({e}); delete the "
                        f"archive and download the official one.") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile):
        raise DataError(f"{archive} is not a readable .tar.gz archive; delete it and download again.") from None


def _check_member(member: tarfile.TarInfo, archive: Path, destination: Path) -> None:
    if not (member.isfile() or member.isdir()):
        raise DataError(f"{archive} holds {member.name!r}, which is not a plain file or directory; "
                        f"refusing to extract it: delete the archive and download the official one.")
    target = (destination / member.name).resolve()
    if target != destination and destination not in target.parents:
        raise DataError(f"{archive} holds {member.name!r}, which would land outside {destination}; "
                        f"refusing to extract it: delete the archive and download the official one.")


# ---------------------------------------------------------------------------------------------
# synthetic

def make_synthetic(num_samples: int, num_classes: int = 10, image_size: int = 8,
                   channels: int = 1, seed: int = 0) -> Dataset:
    """Gaussian blobs around one random image per class; for unit tests only, not a benchmark.

    A model can learn it quickly (the classes are far apart compared with the noise), so a test
    sees the loss fall within a few steps. Labels cycle through the classes, so every class
    appears; the first 20% of the shuffled samples are the test split.
    """
    if num_samples < 2:
        raise DataError(f"synthetic data needs at least 2 samples (one to train, one to test), "
                        f"not {num_samples}; raise data.synthetic_samples.")
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_classes, channels, image_size, image_size, generator=generator)
    labels = torch.arange(num_samples) % num_classes
    labels = labels[torch.randperm(num_samples, generator=generator)]
    images = prototypes[labels] + 0.5 * torch.randn(num_samples, channels, image_size, image_size,
                                                    generator=generator)
    num_test = max(1, round(SYNTHETIC_TEST_FRACTION * num_samples))
    return _normalized_dataset("synthetic", images[num_test:], labels[num_test:],
                               images[:num_test], labels[:num_test], num_classes)
