"""tracking/store.py: one rule for what a sqlite: URI names (SQLAlchemy's: three slashes
relative to the current directory, four absolute, options after `?`), the same for a job
that writes the store and for `compare` that reads it; bad URIs are one sentence."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import free_port
from transientvod.cli import main as transientvod_main
from transientvod.config import DEFAULT_OUTPUT_DIR, load_config
from transientvod.tracking.compare import load_runs
from transientvod.tracking.run import open_run, tracking_uri
from transientvod.tracking.store import TrackingError, check_writable, readable_client, sqlite_path, store_uri

IN_MEMORY = ("sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite://?cache=shared", "sqlite:///:memory:?cache=shared")


@pytest.mark.parametrize("uri, path", [
    ("sqlite:///runs/mlflow.db", Path("runs/mlflow.db")),
    ("sqlite:////tmp/x/mlflow.db", Path("/tmp/x/mlflow.db")),
    ("sqlite:///runs/mlflow.db?timeout=20", Path("runs/mlflow.db")),
    ("sqlite:////tmp/x/mlflow.db?timeout=20&uri=true", Path("/tmp/x/mlflow.db")),
])
def test_sqlite_path_follows_sqlalchemy(uri, path):
    assert sqlite_path(uri) == path


def test_other_stores_have_no_sqlite_path():
    assert sqlite_path("http://127.0.0.1:5000") is None
    assert sqlite_path("postgresql://db/mlflow") is None


@pytest.mark.parametrize("uri", IN_MEMORY)
def test_a_store_in_memory_is_one_sentence(uri):
    with pytest.raises(TrackingError, match="in memory") as caught:
        sqlite_path(uri)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("uri", ["sqlite:runs/mlflow.db", "sqlite:/tmp/mlflow.db", "sqlite://host/mlflow.db"])
def test_a_malformed_sqlite_uri_is_one_sentence(uri):
    with pytest.raises(TrackingError, match="three slashes.*four") as caught:
        sqlite_path(uri)
    assert "\n" not in str(caught.value)


def test_store_uri_writes_sqlite_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    here = tmp_path.resolve()
    assert store_uri() == f"sqlite:///{here / DEFAULT_OUTPUT_DIR / 'mlflow.db'}"
    assert store_uri("", "elsewhere") == f"sqlite:///{here / 'elsewhere' / 'mlflow.db'}"
    assert store_uri("sqlite:///a/b.db?timeout=20") == f"sqlite:///{here / 'a' / 'b.db'}?timeout=20"
    assert store_uri("sqlite:////srv/b.db") == "sqlite:////srv/b.db"
    assert store_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    assert store_uri() == f"sqlite:///{here / 'from-env.db'}"
    assert store_uri("sqlite:////srv/b.db") == "sqlite:////srv/b.db"  # the config wins over the environment


def test_a_bare_path_is_not_a_store_uri():
    for check in (store_uri, check_writable, readable_client):
        with pytest.raises(TrackingError, match="is a path, not a store's URI"):
            check("runs/mlflow")


def test_relative_and_absolute_sqlite_uris_name_the_same_file_for_a_job_and_for_compare(tmp_path, monkeypatch):
    """A job opens its run in a store given relative (three slashes) or absolute (four, with
    options); `compare` finds the run through either spelling, from the same directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    database = tmp_path.resolve() / "stores" / "x.db"
    relative, absolute = "sqlite:///stores/x.db", f"sqlite:///{database}?timeout=20"
    assert absolute.startswith("sqlite:////")

    config = load_config(None, ["run.output_dir=out", "run.name=relative", f"tracking.uri={relative}"])
    first = open_run(config)
    assert database.is_file()
    # The workers get an absolute URI: they may start in another directory.
    assert config.tracking.uri == tracking_uri(config) == f"sqlite:///{database}"
    config = load_config(None, ["run.output_dir=out", "run.name=absolute", f"tracking.uri={absolute}"])
    second = open_run(config)
    assert config.tracking.uri == absolute
    assert (tmp_path / "stores" / "mlartifacts").is_dir()

    for uri in (relative, absolute, f"sqlite:///{database}"):
        assert [row.run_id for row in load_runs(uri)] == [first, second]


def test_a_job_refuses_a_store_in_memory(tmp_path):
    config = load_config(None, [f"run.output_dir={tmp_path}"])
    config.tracking.uri = "sqlite:///:memory:"
    with pytest.raises(TrackingError, match="in memory"):
        open_run(config)


def test_write_check_makes_a_relative_store_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_writable("sqlite:///deep/er/mlflow.db?timeout=5")
    assert (tmp_path / "deep" / "er").is_dir()
    assert not (tmp_path / "deep" / "er" / "mlflow.db").exists()


def test_compare_against_no_server_fails_fast_in_one_sentence():
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingError, match="no server listens there") as caught:
        load_runs(uri)
    # MLflow's own defaults retry with backoff for minutes; the store's client does not.
    assert time.monotonic() - started < 30
    assert uri in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("uri, fragment", [
    ("sqlite:///:memory:", "in memory"),
    ("sqlite:runs/mlflow.db", "three slashes"),
    ("nowhere/mlflow", "is a path"),
])
def test_compare_command_with_a_bad_store_uri_is_one_sentence(uri, fragment, capsys, tmp_path):
    assert transientvod_main(["compare", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transientvod: ") and fragment in err and "\n" not in err
    assert not (tmp_path / "out").exists()
