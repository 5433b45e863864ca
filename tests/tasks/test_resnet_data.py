"""Data: fixed, normalized splits; CIFAR-10 read from the official format; broken files and
archives end in one sentence that names the file."""
import functools
import hashlib
import http.server
import io
import os
import pickle
import subprocess
import sys
import tarfile
import threading

import numpy as np
import pytest
import torch

from transientvod.config import DataConfig
from transientvod.tasks.resnet import data
from transientvod.tasks.resnet.data import (DataError, extract_archive, load_cifar10, load_dataset, load_digits_dataset,
                               make_synthetic, read_cifar10_batch, verify_md5)

IMAGES_PER_BATCH = 10


# ---------------------------------------------------------------------------------------------
# Small CIFAR-10 batches written in the official format: a protocol-2 pickle of a dict with
# bytes keys, b"data" a uint8 (N, 3072) array whose rows are the R, G, B planes, row-major.

def official_batch(images: np.ndarray, labels: list[int], name: str) -> bytes:
    batch = {
        b"batch_label": name.encode(),
        b"labels": labels,
        b"data": images.reshape(len(images), 3 * 32 * 32),
        b"filenames": [f"image_{i}.png".encode() for i in range(len(images))],
    }
    return pickle.dumps(batch, protocol=2)


def cifar_images(seed: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(IMAGES_PER_BATCH, 3, 32, 32), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=IMAGES_PER_BATCH)]
    return images, labels


def probe_images() -> tuple[np.ndarray, list[int]]:
    """Image 0 is pure red; image 1 is black but for one green pixel at row 3, column 5."""
    images, labels = cifar_images(seed=99)
    images[0] = 0
    images[0, 0] = 255
    images[1] = 0
    images[1, 1, 3, 5] = 200
    return images, labels


def write_cifar_batches(root) -> dict:
    """Write <root>/cifar-10-batches-py/ with 5 train batches and a test batch; return the truth."""
    batches_dir = root / "cifar-10-batches-py"
    batches_dir.mkdir(parents=True)
    train = [cifar_images(seed=i) for i in range(5)]
    for i, (images, labels) in enumerate(train, start=1):
        (batches_dir / f"data_batch_{i}").write_bytes(official_batch(images, labels, f"training batch {i} of 5"))
    test_x, test_y = probe_images()
    (batches_dir / "test_batch").write_bytes(official_batch(test_x, test_y, "testing batch 1 of 1"))
    return {
        "train_x": np.concatenate([x for x, _ in train]),
        "train_y": sum((y for _, y in train), []),
        "test_x": test_x,
        "test_y": test_y,
    }


def unnormalized(x: torch.Tensor, dataset) -> torch.Tensor:
    """Pixels on the 0..1 scale, undoing the per-channel normalization."""
    mean = torch.tensor(dataset.channel_mean).view(1, -1, 1, 1)
    std = torch.tensor(dataset.channel_std).view(1, -1, 1, 1)
    return x * std + mean


def test_cifar10_official_format_shapes_labels_and_pixels(tmp_path):
    truth = write_cifar_batches(tmp_path)
    ds = load_cifar10(str(tmp_path))
    assert ds.name == "cifar10" and ds.num_classes == 10
    assert ds.train_x.shape == (50, 3, 32, 32) and ds.test_x.shape == (10, 3, 32, 32)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert ds.in_channels == 3 and ds.image_size == 32
    assert ds.train_y.tolist() == truth["train_y"]  # batches 1..5 in order
    assert ds.test_y.tolist() == truth["test_y"]
    # Every pixel comes back where it was, on the 0..1 scale.
    torch.testing.assert_close(unnormalized(ds.train_x, ds) * 255, torch.from_numpy(truth["train_x"]).float(),
                               atol=1e-3, rtol=0)
    test_pixels = unnormalized(ds.test_x, ds)
    torch.testing.assert_close(test_pixels * 255, torch.from_numpy(truth["test_x"]).float(), atol=1e-3, rtol=0)
    # Channel order is R, G, B and rows are rows (not columns).
    red = test_pixels[0]
    assert torch.allclose(red[0], torch.ones(32, 32), atol=1e-5)
    assert torch.allclose(red[1:], torch.zeros(2, 32, 32), atol=1e-5)
    green_dot = test_pixels[1]
    assert green_dot[1, 3, 5].item() == pytest.approx(200 / 255, abs=1e-5)
    assert green_dot[1, 5, 3].item() == pytest.approx(0, abs=1e-5)
    assert green_dot.abs().sum().item() == pytest.approx(200 / 255, abs=1e-3)


def test_cifar10_train_split_is_normalized_per_channel(tmp_path):
    write_cifar_batches(tmp_path)
    ds = load_cifar10(tmp_path)
    per_channel = ds.train_x.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(per_channel.mean(dim=1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_channel.std(dim=1), torch.ones(3), atol=1e-4, rtol=0)


def test_cifar10_reads_protocol_5_pickles_too(tmp_path):
    images, labels = cifar_images(seed=7)
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({b"data": images.reshape(10, -1), b"labels": labels}, protocol=5))
    x, y = read_cifar10_batch(path)
    assert np.array_equal(x, images) and y.tolist() == labels


def test_load_dataset_dispatches_to_cifar10(tmp_path):
    write_cifar_batches(tmp_path)
    ds = load_dataset(DataConfig(dataset="cifar10", root=str(tmp_path)))
    assert ds.name == "cifar10" and len(ds.train_y) == 50


def test_cifar10_missing_root_names_the_path(tmp_path):
    root = tmp_path / "no-such-dir"
    with pytest.raises(DataError) as e:
        load_cifar10(str(root))
    assert str(root) in str(e.value) and "data.root" in str(e.value)


def test_cifar10_root_without_batches_directory_names_it(tmp_path):
    with pytest.raises(DataError) as e:
        load_cifar10(str(tmp_path))
    assert str(tmp_path / "cifar-10-batches-py") in str(e.value)


def test_cifar10_missing_batch_file_names_it(tmp_path):
    write_cifar_batches(tmp_path)
    missing = tmp_path / "cifar-10-batches-py" / "data_batch_4"
    missing.unlink()
    with pytest.raises(DataError) as e:
        load_cifar10(str(tmp_path))
    assert str(missing) in str(e.value) and "missing" in str(e.value)


@pytest.mark.parametrize("content", [
    pytest.param(b"\x00\xffthis is not a pickle at all" * 40, id="garbage-bytes"),
    pytest.param(b"", id="empty-file"),
    pytest.param(pickle.dumps({b"data": np.zeros((10, 3072), np.uint8)}, protocol=2), id="no-labels-key"),
    pytest.param(pickle.dumps({"data": np.zeros((10, 3072), np.uint8), "labels": [0] * 10}), id="str-keys"),
    pytest.param(pickle.dumps([1, 2, 3], protocol=2), id="not-a-dict"),
    pytest.param(pickle.dumps({b"data": np.zeros((10, 1024), np.uint8), b"labels": [0] * 10}, protocol=2),
                 id="wrong-data-shape"),
    pytest.param(pickle.dumps({b"data": np.zeros((10, 3072), np.float32), b"labels": [0] * 10}, protocol=2),
                 id="wrong-data-dtype"),
    pytest.param(pickle.dumps({b"data": np.zeros((10, 3072), np.uint8), b"labels": [0] * 9}, protocol=2),
                 id="too-few-labels"),
    pytest.param(pickle.dumps({b"data": np.zeros((10, 3072), np.uint8), b"labels": [10] * 10}, protocol=2),
                 id="label-out-of-range"),
])
def test_cifar10_broken_batch_is_one_sentence_naming_the_file(tmp_path, content):
    write_cifar_batches(tmp_path)
    broken = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    broken.write_bytes(content)
    with pytest.raises(DataError) as e:
        load_cifar10(str(tmp_path))
    message = str(e.value)
    assert str(broken) in message and "not an official CIFAR-10 python batch" in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence
    # No chained traceback from inside pickle: nothing is shown but the sentence.
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)


class RunsCodeWhenUnpickled:
    """A pickle that would create a directory if unpickled with plain pickle.load."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_cifar10_batch_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": RunsCodeWhenUnpickled(marker), b"labels": []}, protocol=2))
    with pytest.raises(DataError, match="not an official CIFAR-10 python batch"):
        read_cifar10_batch(path)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# The archive: MD5 check and safe extraction (tested on small archives built here).

def make_tar_gz(path, members: dict[str, bytes]) -> str:
    """Write a .tar.gz holding `members` (name -> content) and return its MD5."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_md5_right_is_accepted_wrong_is_refused(tmp_path):
    archive = tmp_path / "a.tar.gz"
    md5 = make_tar_gz(archive, {"cifar-10-batches-py/readme.html": b"hello"})
    verify_md5(archive, md5)
    verify_md5(archive, md5.upper())
    with pytest.raises(DataError) as e:
        verify_md5(archive, "0" * 32)
    assert str(archive) in str(e.value) and md5 in str(e.value) and "0" * 32 in str(e.value)


def test_extract_archive_writes_members(tmp_path):
    archive = tmp_path / "a.tar.gz"
    make_tar_gz(archive, {"cifar-10-batches-py/batches.meta": b"meta", "cifar-10-batches-py/test_batch": b"x"})
    out = tmp_path / "out"
    out.mkdir()
    extract_archive(archive, out)
    assert (out / "cifar-10-batches-py" / "batches.meta").read_bytes() == b"meta"
    assert (out / "cifar-10-batches-py" / "test_batch").read_bytes() == b"x"


@pytest.mark.parametrize("evil_name", ["../escaped.txt", "cifar-10-batches-py/../../escaped.txt", "/tmp/escaped.txt"])
def test_extract_archive_refuses_members_escaping_the_destination(tmp_path, evil_name):
    archive = tmp_path / "evil.tar.gz"
    # The harmless member comes first: nothing at all may be written when any member is bad.
    make_tar_gz(archive, {"cifar-10-batches-py/ok.txt": b"ok", evil_name: b"evil"})
    out = tmp_path / "deep" / "out"
    out.mkdir(parents=True)
    with pytest.raises(DataError) as e:
        extract_archive(archive, out)
    assert evil_name in str(e.value) and str(archive) in str(e.value)
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()
    assert list(out.iterdir()) == []


def test_extract_archive_refuses_links(tmp_path):
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataError, match="not a plain file or directory"):
        extract_archive(archive, out)
    assert list(out.iterdir()) == []


def test_extract_archive_refuses_a_file_that_is_not_a_tar_gz(tmp_path):
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"<html>404 Not Found</html>")
    with pytest.raises(DataError) as e:
        extract_archive(archive, tmp_path)
    assert str(archive) in str(e.value) and "not a readable .tar.gz" in str(e.value)


def official_archive(tmp_path) -> tuple:
    """A cifar-10-python.tar.gz laid out like the official one (small batches); returns (path, md5)."""
    source = tmp_path / "source"
    write_cifar_batches(source)
    archive = tmp_path / "served" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return archive, hashlib.md5(archive.read_bytes()).hexdigest()


class QuietFileHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass  # keep request lines out of the test output


@pytest.fixture
def served_archive(tmp_path, monkeypatch):
    """The small archive served over real HTTP on loopback, standing in for the official URL."""
    archive, md5 = official_archive(tmp_path)
    handler = functools.partial(QuietFileHandler, directory=str(archive.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setattr(data, "CIFAR10_URL", f"http://127.0.0.1:{server.server_port}/{archive.name}")
    monkeypatch.setattr(data, "CIFAR10_MD5", md5)
    yield archive
    server.shutdown()
    server.server_close()


def test_cifar10_download_fetches_verifies_and_extracts(tmp_path, served_archive):
    root = tmp_path / "cifar"
    ds = load_cifar10(str(root), download=True)
    assert ds.train_x.shape == (50, 3, 32, 32) and ds.test_x.shape == (10, 3, 32, 32)
    assert (root / "cifar-10-python.tar.gz").read_bytes() == served_archive.read_bytes()
    # No half-written leftovers (partial downloads, staging directories).
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]
    # A second load finds the batches and fetches nothing.
    served_archive.unlink()
    assert torch.equal(load_cifar10(str(root), download=True).test_x, ds.test_x)


def test_cifar10_download_with_wrong_md5_keeps_nothing(tmp_path, served_archive, monkeypatch):
    monkeypatch.setattr(data, "CIFAR10_MD5", "0" * 32)
    root = tmp_path / "cifar"
    with pytest.raises(DataError, match="not the expected 0{32}"):
        load_cifar10(str(root), download=True)
    assert list(root.iterdir()) == []


def test_cifar10_download_from_unreachable_url_is_one_sentence(tmp_path, served_archive, monkeypatch):
    monkeypatch.setattr(data, "CIFAR10_URL", data.CIFAR10_URL.replace("cifar-10-python", "missing"))
    root = tmp_path / "cifar"
    with pytest.raises(DataError) as e:
        load_cifar10(str(root), download=True)
    assert "downloading http://127.0.0.1" in str(e.value) and "check the network" in str(e.value)
    assert list(root.iterdir()) == []  # the partial download is gone


# ---------------------------------------------------------------------------------------------
# digits

@pytest.fixture(scope="module")
def digits():
    return load_digits_dataset()


def test_digits_shapes_and_sizes(digits):
    assert digits.name == "digits" and digits.num_classes == 10
    assert len(digits.train_y) + len(digits.test_y) == 1797
    assert len(digits.test_y) == 360  # 20%, rounded up by scikit-learn
    assert digits.train_x.shape == (1437, 1, 8, 8) and digits.test_x.shape == (360, 1, 8, 8)
    assert digits.train_x.dtype == torch.float32 and digits.train_y.dtype == torch.int64
    assert digits.in_channels == 1 and digits.image_size == 8


def test_digits_split_is_the_same_every_time(digits):
    again = load_digits_dataset()
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(digits, name), getattr(again, name)), name
    assert load_dataset(DataConfig(dataset="digits"), seed=123).test_y.tolist() == digits.test_y.tolist()


def test_digits_are_scikit_learns_images_and_split_bit_for_bit(digits):
    """The loader reads scikit-learn's file without importing scikit-learn, and keeps its split
    (digits_split.py): the tensors are those scikit-learn's own loader and split give."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = bunch.images.astype(np.float32)[:, None] / 16.0
    train_x, test_x, train_y, test_y = train_test_split(images, bunch.target, test_size=0.2, random_state=0,
                                                        stratify=bunch.target)
    expected = data._normalized_dataset("digits", torch.from_numpy(train_x), torch.from_numpy(train_y),
                                        torch.from_numpy(test_x), torch.from_numpy(test_y), num_classes=10)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(digits, name), getattr(expected, name)), name
    assert (digits.channel_mean, digits.channel_std) == (expected.channel_mean, expected.channel_std)


def test_the_digits_loader_does_not_import_scikit_learn():
    code = ("import sys; from transientvod.tasks.resnet.data import load_digits_dataset; load_digits_dataset(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_digits_split_is_stratified(digits):
    train_counts = torch.bincount(digits.train_y, minlength=10)
    test_counts = torch.bincount(digits.test_y, minlength=10)
    assert (test_counts > 0).all()
    fraction = test_counts.float() / (train_counts + test_counts).float()
    assert ((fraction > 0.18) & (fraction < 0.22)).all(), fraction


def test_digits_normalized_with_train_statistics(digits):
    assert abs(digits.train_x.mean().item()) < 1e-5
    assert digits.train_x.std().item() == pytest.approx(1.0, abs=1e-3)
    assert abs(digits.test_x.mean().item()) < 0.1  # the test split's own mean is not subtracted
    # Undoing the normalization gives back pixel values 0..16 (scaled to 0..1).
    pixels = unnormalized(digits.train_x, digits) * 16
    torch.testing.assert_close(pixels, pixels.round(), atol=1e-3, rtol=0)
    assert pixels.min().item() == pytest.approx(0, abs=1e-3) and pixels.max().item() == pytest.approx(16, abs=1e-3)


# ---------------------------------------------------------------------------------------------
# synthetic, dispatch, imports

def test_synthetic_shapes_and_classes():
    ds = make_synthetic(100, num_classes=4, image_size=6, channels=3, seed=1)
    assert ds.train_x.shape == (80, 3, 6, 6) and ds.test_x.shape == (20, 3, 6, 6)
    assert ds.train_y.dtype == torch.int64 and ds.num_classes == 4
    assert set(ds.train_y.tolist()) == {0, 1, 2, 3} and set(ds.test_y.tolist()) <= {0, 1, 2, 3}
    assert ds.in_channels == 3 and ds.image_size == 6


def test_synthetic_follows_the_seed():
    a, b, c = make_synthetic(50, seed=3), make_synthetic(50, seed=3), make_synthetic(50, seed=4)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)


def test_synthetic_classes_are_separable():
    # Nearest class mean (from the train split) classifies the test split almost perfectly.
    ds = make_synthetic(400, seed=0)
    means = torch.stack([ds.train_x[ds.train_y == k].flatten(1).mean(0) for k in range(10)])
    predicted = torch.cdist(ds.test_x.flatten(1), means).argmin(dim=1)
    assert (predicted == ds.test_y).float().mean().item() > 0.95


def test_synthetic_too_few_samples_is_refused():
    with pytest.raises(DataError, match="data.synthetic_samples"):
        make_synthetic(1)


def test_load_dataset_dispatch():
    assert load_dataset(DataConfig(dataset="synthetic", synthetic_samples=30), seed=5).train_x.shape == (24, 1, 8, 8)
    with pytest.raises(DataError, match="digits, cifar10, synthetic"):
        load_dataset(DataConfig(dataset="mnist"))
    with pytest.raises(DataError, match="data.root is empty"):
        load_dataset(DataConfig(dataset="cifar10", root=""))


def test_data_module_does_not_import_horovod():
    code = "import sys, transientvod.tasks.resnet.data; print(sorted(m for m in sys.modules if m.startswith('horovod')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
