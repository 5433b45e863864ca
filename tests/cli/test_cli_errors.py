"""Bad input through the real CLI: one sentence on stderr, exit 2, no traceback, no checkpoint."""
from __future__ import annotations

import stat
import subprocess

import pytest

from conftest import (LOCAL_HOSTS, REPO, TRANSIENTVOD, assert_nothing_written, assert_one_sentence,
                      run_train)



def test_missing_data_directory(tmp_path):
    missing = tmp_path / "no-such-dir"
    done = run_train(tmp_path, {"data": {"dataset": "cifar10", "root": str(missing)}})
    assert_one_sentence(done, str(missing))
    assert_nothing_written(tmp_path)


def test_data_file_in_the_wrong_format(tmp_path):
    batches = tmp_path / "cifar" / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (batches / name).write_bytes(b"this is not a pickle")
    done = run_train(tmp_path, {"data": {"dataset": "cifar10", "root": str(tmp_path / "cifar")}})
    assert_one_sentence(done, "data_batch_1")
    assert_nothing_written(tmp_path)


def test_unknown_model_name(tmp_path):
    done = run_train(tmp_path, {"model": {"name": "vgg16"}})
    assert_one_sentence(done, "model.name", "vgg16", "resnet")
    assert_nothing_written(tmp_path)


def test_min_np_above_max_np(tmp_path):
    done = run_train(tmp_path, {"cluster": {"min_np": 4, "max_np": 2}})
    assert_one_sentence(done, "cluster.min_np")
    assert_nothing_written(tmp_path)


def test_discovery_script_not_executable(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    done = run_train(tmp_path, {}, discovery=str(script))
    assert_one_sentence(done, str(script), "not executable", "chmod +x")
    assert_nothing_written(tmp_path)


def test_discovery_script_printing_something_else(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 'hosts: localhost'\n")
    script.chmod(0o755)
    done = run_train(tmp_path, {}, discovery=str(script))
    assert_one_sentence(done, "host:slots")
    assert_nothing_written(tmp_path)


def test_discovery_script_failing(tmp_path):
    done = run_train(tmp_path, {}, discovery=f"{LOCAL_HOSTS} --phase nonsense")
    assert_one_sentence(done, "exited with 2")
    assert_nothing_written(tmp_path)


def test_missing_config_file(tmp_path):
    done = run_train(tmp_path, {}, config_path=tmp_path / "missing.yaml")
    assert_one_sentence(done, "missing.yaml", "does not exist")


@pytest.mark.parametrize("override, key", [("train.steps=-1", "train.steps"), ("train.stepz=5", "train.stepz")])
def test_bad_override(tmp_path, override, key):
    done = subprocess.run(TRANSIENTVOD + ["demo", "--set", override], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert_one_sentence(done, key)


def test_doctor_names_the_backend_of_each_op():
    done = subprocess.run(TRANSIENTVOD + ["doctor"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "compress_ef_" in done.stdout and "-> numba" in done.stdout
    for name in ("compress_ef_", "decompress_avg_", "decompress_sum_", "reduce_compress_ef_"):
        assert f"  {name} " in done.stdout, f"doctor does not name {name}:\n{done.stdout}"


@pytest.mark.parametrize("value, fragment", [("cuda", "CUDA is not available"), ("bogus", "names no kernel backend")])
def test_doctor_with_an_unusable_kernel_override(value, fragment):
    import os
    done = subprocess.run(TRANSIENTVOD + ["doctor"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "TRANSIENTVOD_KERNELS": value})
    assert_one_sentence(done, fragment)


def test_unknown_instance_type_is_named_with_its_cloud(tmp_path):
    done = run_train(tmp_path, {"cost": {"instance_type": "k81"}})
    assert_one_sentence(done, "'k81'", "gce")
    assert_nothing_written(tmp_path)


def test_aws_instance_type_without_a_price_names_type_and_region(tmp_path):
    done = run_train(tmp_path, {"cost": {"cloud": "aws", "instance_type": "p9.mega", "market": "on-demand",
                                         "region": "us-east-1"}})
    assert_one_sentence(done, "'p9.mega'", "us-east-1")
    assert_nothing_written(tmp_path)


def test_unwritable_tracking_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = run_train(tmp_path, {"tracking": {"uri": f"sqlite:///{blocker}/mlflow.db"}})
    assert_one_sentence(done, str(blocker), "tracking.uri")
    assert_nothing_written(tmp_path)


def test_unreachable_tracking_server_stops_the_job_before_it_starts(tmp_path):
    from conftest import free_port
    uri = f"http://127.0.0.1:{free_port()}"
    done = run_train(tmp_path, {"tracking": {"uri": uri}})
    assert_one_sentence(done, uri, "does not answer")
    assert_nothing_written(tmp_path)


def test_compare_names_a_run_that_does_not_exist(tmp_path):
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("transientvod")  # a real, empty store
    done = subprocess.run(TRANSIENTVOD + ["compare", "--tracking-uri", uri, "0123456789abcdef"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert_one_sentence(done, "0123456789abcdef", uri)
