"""The launcher's channel to workers on hosts that share no disk (channel/): a real HTTP
server on 127.0.0.1 and the worker's real client. The jobs that use it run on the testbed
(tests/testbed/test_private_disk.py)."""
from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.request

import pytest

from transientvod.channel.protocol import TOKEN_HEADER, ChannelError
from transientvod.channel.records import ChannelRecord, fetch_config
from transientvod.channel.server import JobChannel

CONFIG = "run:\n  name: demo\n"


@pytest.fixture
def channel(tmp_path):
    with JobChannel(tmp_path / "head-run", CONFIG, "127.0.0.1") as served:
        yield served


def request(url: str, token: str, method: str = "GET", body: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method,
                                                           headers={TOKEN_HEADER: token}), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_worker_gets_the_config_and_its_records_land_on_the_head_in_order(channel, tmp_path):
    assert fetch_config(channel.config_url, channel.token) == CONFIG
    worker_disk = tmp_path / "worker-run"
    record = ChannelRecord(channel.url, channel.token, worker_disk)
    for step in range(1, 201):
        record.append("metrics.jsonl", {"step": step})
        if step % 50 == 0:
            record.append("events.jsonl", {"event": "synced", "step": step})
    record.write_summary(json.dumps({"steps": 200}) + "\n")
    record.close()
    head = channel.run_dir
    assert [r["step"] for r in rows(head / "metrics.jsonl")] == list(range(1, 201))
    assert [r["step"] for r in rows(head / "events.jsonl")] == [50, 100, 150, 200]
    assert json.loads((head / "summary.json").read_text()) == {"steps": 200}
    assert not worker_disk.exists(), "nothing should be left on the worker's own disk"


def test_a_wrong_token_reads_nothing_and_writes_nothing(channel):
    with pytest.raises(ChannelError) as refused:
        fetch_config(channel.config_url, "not-the-token")
    assert "refused this worker's token" in str(refused.value) and "\n" not in str(refused.value)
    assert request(f"{channel.url}/records/metrics.jsonl", "not-the-token", "POST", b'{"step": 1}\n') == 403
    assert request(f"{channel.url}/summary.json", "", "PUT", b"{}") == 403
    assert list(channel.run_dir.iterdir()) == []


@pytest.mark.parametrize("path", ["/records/config.yaml", "/records/../summary.json", "/records/x/../metrics.jsonl",
                                  "/metrics.jsonl"])
def test_only_the_runs_record_files_can_be_appended_to(channel, path):
    assert request(channel.url + path, channel.token, "POST", b'{"step": 1}\n') == 404
    assert list(channel.run_dir.iterdir()) == []


def test_partial_lines_and_a_summary_that_is_not_json_are_refused(channel):
    assert request(f"{channel.url}/records/metrics.jsonl", channel.token, "POST", b'{"step": 1}') == 400
    assert request(f"{channel.url}/summary.json", channel.token, "PUT", b"not json") == 400
    assert list(channel.run_dir.iterdir()) == []


def free_port_nobody_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_head_that_never_answers_leaves_the_records_on_the_workers_disk(tmp_path, caplog):
    url = f"http://127.0.0.1:{free_port_nobody_listens_on()}"
    record = ChannelRecord(url, "token", tmp_path / "worker-run")
    record.append("metrics.jsonl", {"step": 1})
    record.append("events.jsonl", {"event": "synced"})
    with caplog.at_level(logging.WARNING):
        record.write_summary('{"steps": 1}\n', timeout=1)
        record.close(timeout=1)
    worker = tmp_path / "worker-run"
    assert rows(worker / "metrics.jsonl") == [{"step": 1}] and rows(worker / "events.jsonl") == [{"event": "synced"}]
    assert json.loads((worker / "summary.json").read_text()) == {"steps": 1}
    assert "did not take 2 record lines" in caplog.text


def test_a_config_that_cannot_be_fetched_is_one_sentence_naming_the_url():
    url = f"http://127.0.0.1:{free_port_nobody_listens_on()}/config.yaml"
    with pytest.raises(ChannelError) as failed:
        fetch_config(url, "token", attempts=1)
    message = str(failed.value)
    assert url in message and "cluster.network_interface" in message and "\n" not in message


def test_an_address_not_on_this_machine_is_one_sentence(tmp_path):
    with pytest.raises(ChannelError) as failed:
        JobChannel(tmp_path, CONFIG, "192.0.2.1")  # TEST-NET-1: on no interface here
    assert "cluster.network_interface" in str(failed.value)


def test_a_worker_on_a_host_that_does_not_share_the_local_checkpoint_dir_says_so(tmp_path):
    # The launcher leaves its marker in a local checkpoint.dir while a job with remote hosts
    # runs; a worker on a host that joined later, with its own disk there, does not see it.
    from transientvod.config import load_config
    from transientvod.checkpoint.shared_disk import LAUNCHER_MARKER, SharedDiskError, check_marker_seen

    config = load_config(None, [f"run.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(SharedDiskError) as unseen:
        check_marker_seen(config, "tvd-h3")
    message = str(unseen.value)
    assert "(tvd-h3) does not share" in message and "s3://" in message and "\n" not in message
    marker = tmp_path / "runs" / config.run.name / "checkpoints" / LAUNCHER_MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    check_marker_seen(config, "tvd-h3")  # a shared mount: the marker is there
    check_marker_seen(load_config(None, ["checkpoint.dir=s3://bucket/job"]), "tvd-h3")  # S3: nothing to share


# --- ports: cluster.head_ports ----------------------------------------------------------------

def free_range(size: int) -> tuple[int, int]:
    """`size` consecutive ports free on 127.0.0.1 now (bound together, then released)."""
    for first in range(31000, 32000, size):
        sockets = []
        try:
            for port in range(first, first + size):
                held = socket.socket()
                sockets.append(held)
                held.bind(("127.0.0.1", port))
            return first, first + size - 1
        except OSError:
            continue
        finally:
            for held in sockets:
                held.close()
    pytest.skip("no free run of ports between 31000 and 32000")


def test_the_channel_binds_the_first_free_port_of_the_range(tmp_path):
    first, last = free_range(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        with JobChannel(tmp_path / "run", CONFIG, "127.0.0.1", (first, last)) as channel:
            assert channel.url == f"http://127.0.0.1:{first + 1}"
            assert fetch_config(channel.config_url, channel.token) == CONFIG
            # The port is really the channel's: a second channel gets the next one.
            with JobChannel(tmp_path / "run2", CONFIG, "127.0.0.1", (first, last)) as second:
                assert second.url == f"http://127.0.0.1:{last}"


def test_a_range_whose_every_port_is_taken_is_one_sentence(tmp_path):
    first, last = free_range(2)
    with socket.socket() as one, socket.socket() as two:
        for held, port in ((one, first), (two, last)):
            held.bind(("127.0.0.1", port))
            held.listen()
        with pytest.raises(ChannelError) as refused:
            JobChannel(tmp_path / "run", CONFIG, "127.0.0.1", (first, last))
    assert str(refused.value) == (f"every port of cluster.head_ports [{first}, {last}] is taken on 127.0.0.1 (by "
                                  "other jobs or programs), so the job channel has none; widen the range.")
