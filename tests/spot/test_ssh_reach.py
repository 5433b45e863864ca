"""The launcher's SSH preflight (spot/reach/ssh.py), on loopback only: which hosts are remote by
Horovod's rule, and the one sentence when none answers. A wrong key on a real host (a testbed
host that booted from the fleet's user data) is tests/testbed/test_fleet_join.py."""
from __future__ import annotations

import socket
import subprocess

import pytest

from conftest import REPO, TINY_JOB, TRANSIENTVOD, heavy_modules_imported

from transientvod.spot.reach import ssh as ssh_reach

# 127.0.0.2 is loopback, but not an address of any interface (lo has 127.0.0.1/8): Horovod
# calls it remote and would ssh to it. Nothing listens on its port 22 here.
UNREACHABLE = "127.0.0.2"


def nothing_listens_on(address: str) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((address, 22)) != 0


def test_local_names_are_not_probed_and_other_names_are_remote():
    assert ssh_reach.remote_hosts(["localhost", "127.0.0.1", socket.gethostname(), UNREACHABLE,
                                   "no-such-host.invalid"]) == [UNREACHABLE, "no-such-host.invalid"]
    assert ssh_reach.check_reach(["localhost", "127.0.0.1"]) is None  # nothing to reach: no ssh at all


@pytest.mark.skipif(not nothing_listens_on(UNREACHABLE), reason=f"something listens on {UNREACHABLE}:22 here")
def test_no_reachable_host_is_one_sentence_naming_the_host_what_ssh_said_and_the_key():
    with pytest.raises(ssh_reach.UnreachableHosts) as error:
        ssh_reach.check_reach(["localhost", UNREACHABLE, "no-such-host.invalid"])
    message = str(error.value)
    named, offered = ssh_reach.identity_files(UNREACHABLE)
    key = f"key {', '.join(offered)}" if offered else f"no key (none of {', '.join(named)} exists)"
    assert message == (
        f"the launcher reaches no worker host over SSH: {UNREACHABLE} (and 1 more hosts) answered "
        f"'ssh: connect to host {UNREACHABLE} port 22: Connection refused' to {key}; authorize that key on the "
        "workers (transientvod fleet --ssh-public-key takes its .pub) or name the right one as IdentityFile in "
        "~/.ssh/config, and note that a fleet's host takes the key only once its user data has finished "
        "(/var/log/transientvod-join.log on the host).")


@pytest.mark.skipif(not nothing_listens_on(UNREACHABLE), reason=f"something listens on {UNREACHABLE}:22 here")
def test_train_stops_before_horovodrun_when_no_listed_host_answers(tmp_path):
    import yaml

    config = {**TINY_JOB, "run": {"name": "unreachable", "output_dir": str(tmp_path / "runs")},
              "tracking": {"enabled": False}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(TRANSIENTVOD + ["train", "--config", str(tmp_path / "job.yaml"), "--discovery",
                                          f"echo {UNREACHABLE}:1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"transientvod: the launcher reaches no worker host over SSH: {UNREACHABLE} answered "
                           f"'ssh: connect to host {UNREACHABLE} port 22: Connection refused' to "), done.stderr
    assert "transientvod: starting" not in done.stdout  # horovodrun never ran
    assert not (tmp_path / "runs" / "unreachable").exists()


def test_the_join_modules_import_neither_torch_nor_horovod():
    assert heavy_modules_imported("transientvod.spot.reach.ssh", "transientvod.spot.provisioning.user_data") == []
