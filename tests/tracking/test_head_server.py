"""tracking/head_server.py: a real `mlflow server` on a job's SQLite store, reached the way a
remote worker reaches it (by the URL's address, which MLflow's Host-header check must accept);
what workers log there is in the SQLite file; stopping it leaves no process and a free port;
a server that cannot start is one TrackingError sentence and leaves no process either.

Servers listen on 127.0.0.2: a loopback address that MLflow's default allowed hosts do not
cover (only localhost, 127.0.0.1 and private ranges), as a head's public address would not be."""
from __future__ import annotations

import os
import socket
import sqlite3
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import new_mlflow_store
from transientvod.tracking.head_server import StoreServer
from transientvod.tracking.sender import MetricSender
from transientvod.tracking.store import TrackingError

ADDRESS = "127.0.0.2"
TEST_NET = "192.0.2.1"  # RFC 5737: never an address of this machine


def store_with_run(directory: Path) -> tuple[str, str]:
    """A SQLite store holding one open run, as the launcher leaves it: (uri, run id)."""
    from mlflow import MlflowClient

    uri = new_mlflow_store(directory)
    head = MlflowClient(uri)
    experiment = head.create_experiment("job", artifact_location=(directory / "mlartifacts" / "job").as_uri())
    return uri, head.create_run(experiment).info.run_id


def server_processes(database: Path, address: str, port: int) -> list[psutil.Process]:
    """Live processes of a server for `database` on address:port: the MLflow CLI names the
    database, its uvicorn only the address and port."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        words = process.info["cmdline"] or []
        text = " ".join(words)
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if str(database) in text or ("mlflow" in text and f"--host {address} --port {port}" in text):
            found.append(process)
    return found


def group_members(group: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def port_is_free(address: str, port: int) -> bool:
    with socket.socket() as client:
        client.settimeout(2)
        if client.connect_ex((address, port)) == 0:
            return False  # something still listens
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        probe.bind((address, port))
    return True


def one_sentence(error: TrackingError) -> str:
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    return text


@pytest.mark.slow
def test_metrics_logged_through_the_server_are_in_the_sqlite_file(tmp_path):
    uri, run_id = store_with_run(tmp_path)
    began = time.monotonic()
    with StoreServer(uri, ADDRESS, log_path=tmp_path / "server.log") as server:
        startup = time.monotonic() - began
        assert server.url == f"http://{ADDRESS}:{server.port}" and server.port > 0
        # Rank 0's way: MetricSender, which sends log_batch from its thread.
        sender = MetricSender(server.url, run_id, tmp_path / "unsent.jsonl", retry_seconds=0.2)
        for step in range(1, 4):
            sender.log({"loss": 1.0 / step, "rate": 10.0 * step}, step=step, at=1000.0 + step)
        assert sender.close(timeout=60) == 0, (tmp_path / "server.log").read_text()[-3000:]
        assert not (tmp_path / "unsent.jsonl").exists()
        # A worker reads the run back through the server too (a GET, past the Host check).
        from mlflow import MlflowClient

        assert MlflowClient(server.url).get_run(run_id).data.metrics == {"loss": pytest.approx(1 / 3), "rate": 30.0}
    print(f"mlflow server answered /health after {startup:.1f} s")
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        rows = db.execute("SELECT key, value, step, timestamp FROM metrics WHERE run_uuid = ? ORDER BY key, step",
                          (run_id,)).fetchall()
    assert rows == [("loss", pytest.approx(1.0), 1, 1001000), ("loss", pytest.approx(0.5), 2, 1002000),
                    ("loss", pytest.approx(1 / 3), 3, 1003000),
                    ("rate", 10.0, 1, 1001000), ("rate", 20.0, 2, 1002000), ("rate", 30.0, 3, 1003000)]
    # The log the caller asked for is kept.
    assert (tmp_path / "server.log").stat().st_size > 0


@pytest.mark.slow
def test_stop_ends_the_server_and_its_worker_and_frees_the_port(tmp_path):
    uri, _ = store_with_run(tmp_path)
    server = StoreServer(uri, ADDRESS).start()
    group, port, log_path = server.pid, server.port, server.log_path
    members = group_members(group)
    # The MLflow CLI and the uvicorn it starts: stopping only the first would leave the second.
    assert len(members) >= 2, [m.cmdline() for m in members]
    assert psutil.Process(group).children(recursive=True)
    server.stop()
    assert not psutil.pid_exists(group) or psutil.Process(group).status() == psutil.STATUS_ZOMBIE
    assert group_members(group) == []
    assert not any(psutil.pid_exists(m.pid) and m.status() != psutil.STATUS_ZOMBIE for m in members)
    assert port_is_free(ADDRESS, port)
    assert not log_path.exists()  # a temporary log goes with a clean stop
    server.stop()  # again: nothing to do
    assert server.pid is None


def test_an_address_not_on_this_machine_is_one_sentence_and_starts_nothing(tmp_path, monkeypatch):
    uri, _ = store_with_run(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where a default log would go
    with pytest.raises(TrackingError) as caught:
        StoreServer(uri, TEST_NET).start()
    text = one_sentence(caught.value)
    assert TEST_NET in text and uri in text and "not an address of this machine" in text, text
    assert server_processes(tmp_path / "mlflow.db", TEST_NET, 0) == []
    assert list(scratch.iterdir()) == []  # no log for a server that never started


def test_a_missing_store_is_one_sentence_and_is_not_created(tmp_path):
    missing = tmp_path / "no-such-dir" / "mlflow.db"
    with pytest.raises(TrackingError) as caught:
        StoreServer(f"sqlite:///{missing}", "127.0.0.1").start()
    assert str(missing) in one_sentence(caught.value)
    assert not missing.parent.exists()
    assert server_processes(missing, "127.0.0.1", 0) == []


def test_a_port_in_use_is_one_sentence(tmp_path):
    uri, _ = store_with_run(tmp_path)
    with socket.socket() as taken:
        taken.bind((ADDRESS, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(TrackingError, match="pick another port") as caught:
            StoreServer(uri, ADDRESS, port=port).start()
    assert f"{ADDRESS}:{port}" in one_sentence(caught.value)


@pytest.mark.parametrize("uri, address, words", [
    ("http://127.0.0.1:5000", "127.0.0.1", "not a SQLite store"),
    ("sqlite:////tmp/mlflow.db", "0.0.0.0", "cluster address"),
    ("sqlite://", "127.0.0.1", "in memory"),
])
def test_what_cannot_be_served_is_one_sentence(uri, address, words):
    with pytest.raises(TrackingError, match=words) as caught:
        StoreServer(uri, address)
    one_sentence(caught.value)


@pytest.mark.slow
def test_a_server_that_exits_is_one_sentence_with_its_last_error_and_leaves_nothing(tmp_path):
    database = tmp_path / "mlflow.db"
    database.write_text("not a database\n")
    log_path = tmp_path / "server.log"
    server = StoreServer(f"sqlite:///{database}", ADDRESS, log_path=log_path)
    with pytest.raises(TrackingError) as caught:
        server.start()
    text = one_sentence(caught.value)
    assert str(database) in text and f"{ADDRESS}:{server.port}" in text, text
    assert "exited with status" in text and "file is not a database" in text, text
    assert str(log_path) in text and log_path.exists()  # kept, for whoever reads the error
    assert server.pid is None
    assert server_processes(database, ADDRESS, server.port) == []


def test_a_server_that_does_not_answer_in_time_is_stopped(tmp_path):
    uri, _ = store_with_run(tmp_path)
    server = StoreServer(uri, ADDRESS, log_path=tmp_path / "server.log", start_seconds=0.5)
    with pytest.raises(TrackingError) as caught:
        server.start()
    assert "did not answer" in one_sentence(caught.value) and "within 0.5 s" in str(caught.value)
    assert server_processes(tmp_path / "mlflow.db", ADDRESS, server.port) == []
    assert port_is_free(ADDRESS, server.port)


@pytest.mark.slow
def test_a_picked_port_taken_before_the_server_binds_is_picked_again(tmp_path, monkeypatch):
    uri, run_id = store_with_run(tmp_path)
    with socket.socket() as taken:
        taken.bind((ADDRESS, 0))
        taken.listen()
        lost = taken.getsockname()[1]
        # The race start() accepts: the first port it picks is someone else's by the time the
        # server binds it.
        picks = []
        real = StoreServer._free_port

        def first_pick_is_lost(server, port):
            picks.append(port)
            return lost if len(picks) == 1 else real(server, port)

        monkeypatch.setattr(StoreServer, "_free_port", first_pick_is_lost)
        with StoreServer(uri, ADDRESS, log_path=tmp_path / "server.log") as server:
            assert picks == [0, 0] and server.port != lost
            from mlflow import MlflowClient

            assert MlflowClient(server.url).get_run(run_id).info.run_id == run_id
    assert "[Errno 98]" in (tmp_path / "server.log").read_text()


def test_with_a_port_range_the_server_listens_on_its_first_free_port(tmp_path):
    uri, run_id = store_with_run(tmp_path)
    first = 31500
    with socket.socket() as taken:
        taken.bind((ADDRESS, first))
        taken.listen()
        with StoreServer(uri, ADDRESS, ports=(first, first + 2), log_path=tmp_path / "server.log") as server:
            assert server.port == first + 1
            from mlflow import MlflowClient

            assert MlflowClient(server.url).get_run(run_id).info.run_id == run_id
            listening = {c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            assert (ADDRESS, first + 1) in {(a.ip, a.port) for a in listening}


def test_a_port_range_with_every_port_taken_is_one_sentence_and_starts_nothing(tmp_path):
    uri, _ = store_with_run(tmp_path)
    first = 31510
    with socket.socket() as one, socket.socket() as two:
        for held, port in ((one, first), (two, first + 1)):
            held.bind((ADDRESS, port))
            held.listen()
        with pytest.raises(TrackingError) as caught:
            StoreServer(uri, ADDRESS, ports=(first, first + 1), log_path=tmp_path / "server.log").start()
    assert one_sentence(caught.value) == (f"every port of cluster.head_ports [{first}, {first + 1}] is taken on "
                                          f"{ADDRESS} (by other jobs or programs), so the MLflow server has none; "
                                          "widen the range.")
    assert not (tmp_path / "server.log").exists()
