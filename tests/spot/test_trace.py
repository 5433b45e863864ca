"""The trace provider on the study's real revocation traces, and on broken trace files."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from transientvod.spot.hosts import GONE, NOTICED, USABLE
from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.providers.trace import TraceProvider, load_trace, select_run, shipped_trace

REPO = Path(__file__).resolve().parents[2]
STUDY_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "gce-2019"
SHIPPED_DATA = REPO / "transientvod" / "spot" / "traces" / "gce-2019"
TRACES = ["k80_spot_2workers_vm_trace.csv", "k80_spot_4workers_vm_trace.csv", "k80_spot_8workers_vm_trace.csv"]
HOSTS = ["localhost", "127.0.0.1", "127.0.0.2", "127.0.0.3"]


def revoked_by_csv(path: Path) -> int:
    """Revocations counted straight from the file, without the code under test."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    cloud = sum(row["Revoked"].strip().lower() == "revoked" for row in rows)
    masters = sum(row["VM_name"].endswith("-master") and row["Revoked"].lower().startswith("manually stopped")
                  for row in rows)
    return cloud + masters


def as_tuples(runs):
    return {rid: [(v.vm, v.role, v.index, v.uptime_s, v.outcome) for v in run.vms] for rid, run in runs.items()}


# ---- the study's data ---------------------------------------------------------------------------

def test_shipped_copy_is_complete_and_unchanged():
    if not STUDY_DATA.is_dir():
        pytest.skip(f"the study's data is not at {STUDY_DATA}")
    study = sorted(p.name for p in STUDY_DATA.iterdir())
    shipped = sorted(p.name for p in SHIPPED_DATA.iterdir() if p.name != "PROVENANCE.md")
    assert shipped == study
    for name in study:
        assert (SHIPPED_DATA / name).read_bytes() == (STUDY_DATA / name).read_bytes(), name
    for name in TRACES:
        assert as_tuples(load_trace(STUDY_DATA / name)) == as_tuples(load_trace(shipped_trace(name)))


def test_shipped_trace_names_and_unknown_name():
    assert shipped_trace("k80_spot_4workers_vm_trace.csv") == SHIPPED_DATA / "k80_spot_4workers_vm_trace.csv"
    assert (SHIPPED_DATA / "PROVENANCE.md").is_file()
    with pytest.raises(ProviderError, match=r"k80_spot_2workers_vm_trace\.csv.*k80_spot_8workers_vm_trace\.csv") as e:
        shipped_trace("k80_spot_16workers_vm_trace.csv")
    assert str(e.value).count(".") >= 3 and "\n" not in str(e.value)


@pytest.mark.parametrize("name, vms_per_run, revoked", [
    ("k80_spot_2workers_vm_trace.csv", 2, 7),
    ("k80_spot_4workers_vm_trace.csv", 4, 13),
    ("k80_spot_8workers_vm_trace.csv", 8, 8),
])
def test_runs_and_revocations_per_trace(name, vms_per_run, revoked):
    path = shipped_trace(name)
    runs = load_trace(path)
    assert len(runs) == 32
    for run in runs.values():
        # The file name counts every training VM: the master and workers 0..n-2.
        assert [v.index for v in run.vms] == list(range(vms_per_run))
        assert run.vms[0].role == "master" and run.vms[0].vm == f"{run.run_id}-master"
        assert all(v.vm == f"{run.run_id}-worker-{v.index - 1}" for v in run.vms[1:])
    found = sum(len(run.revoked_vms()) for run in runs.values())
    assert found == revoked_by_csv(path) == revoked


def test_four_worker_trace_matches_the_study():
    runs = load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv"))
    with open(shipped_trace("k80_spot_4workers_vm_trace.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert sum(len(run.vms) for run in runs.values()) == len(rows) == 128
    # The paper: "13 servers were revoked in 11 runs, and one run failed because its master was revoked".
    hit = [run for run in runs.values() if run.revoked_vms()]
    assert len(hit) == 11
    assert sum(len(run.revoked_vms()) for run in hit) == 13
    assert [run.run_id for run in hit if any(v.role == "master" for v in run.revoked_vms())] == ["us-east1-c-run7"]

    run3 = runs["us-east1-c-run3"]
    assert select_run(runs, 3) is run3 and select_run(runs, "3") is run3 and select_run(runs, "us-east1-c-run3") is run3
    [worker0] = run3.revoked_vms()
    assert (worker0.vm, worker0.role, worker0.index, worker0.uptime_s, worker0.outcome) == \
        ("us-east1-c-run3-worker-0", "worker", 1, 1454.486057, "revoked")
    assert [v.outcome for v in run3.vms] == ["completed", "revoked", "completed", "completed"]


def test_master_revocation_leaves_workers_usable():
    runs = load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv"))
    run7 = runs["us-east1-c-run7"]
    assert {v.outcome for v in run7.vms} == {"stopped"}  # every line: manually stopped due to revoked master
    [master] = run7.revoked_vms()
    assert master.role == "master" and master.uptime_s == 3629.508231

    start = 1_000_000.0
    provider = TraceProvider(run7, HOSTS, start_time=start, time_scale=1.0)
    [revocation] = provider.revocations()
    assert (revocation.host, revocation.instance_id) == ("localhost", "us-east1-c-run7-master")
    assert revocation.revoke_at == start + 3629.508231
    assert revocation.notice_at == pytest.approx(start + 3629.508231 - 30)
    long_after = provider.poll(start + 10 * 3600)
    assert [h.state for h in long_after] == [GONE, USABLE, USABLE, USABLE]
    assert all(h.notice_at is None and h.terminate_at is None for h in long_after[1:])


def test_eight_worker_trace_has_two_master_revocations():
    runs = load_trace(shipped_trace("k80_spot_8workers_vm_trace.csv"))
    masters = [run.run_id for run in runs.values() if any(v.role == "master" for v in run.revoked_vms())]
    assert masters == ["spot8-us-west1-b-run5", "spot8-europe-west1-b-run3"]
    assert [v.role for v in runs["spot8-us-west1-b-run5"].revoked_vms()] == ["master"]


# ---- replay timeline ----------------------------------------------------------------------------

def test_run3_timeline_compressed_sixty_times():
    run3 = select_run(load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv")), 3)
    start = 1_800_000_000.0
    provider = TraceProvider(run3, HOSTS, start_time=start, time_scale=60, notice_seconds=30, slots=2)
    revoke_at = start + 1454.486057 / 60
    notice_at = revoke_at - 30 / 60
    [revocation] = provider.revocations()
    assert revocation.host == "127.0.0.1" and revocation.instance_id == "us-east1-c-run3-worker-0"
    assert revocation.revoke_at == pytest.approx(revoke_at) and revocation.notice_at == pytest.approx(notice_at)

    def states(now):
        statuses = provider.poll(now)
        assert [h.name for h in statuses] == HOSTS
        assert [h.instance_id for h in statuses] == [v.vm for v in run3.vms]
        assert all(h.slots == 2 for h in statuses)
        return statuses

    before = states(notice_at - 0.01)
    assert [h.state for h in before] == [USABLE] * 4
    assert all(h.notice_at is None and h.terminate_at is None for h in before)

    between = states((notice_at + revoke_at) / 2)
    assert [h.state for h in between] == [USABLE, NOTICED, USABLE, USABLE]
    assert between[1].notice_at == pytest.approx(notice_at) and between[1].terminate_at == pytest.approx(revoke_at)
    assert states(notice_at)[1].state == NOTICED  # the notice is visible from its own second

    after = states(revoke_at)
    assert [h.state for h in after] == [USABLE, GONE, USABLE, USABLE]
    assert after[1].notice_at == pytest.approx(notice_at) and after[1].terminate_at == pytest.approx(revoke_at)
    # Completed VMs stay usable long past their own uptime: the replay never ends a run.
    assert [h.state for h in states(start + 10 * 4599.65)] == [USABLE, GONE, USABLE, USABLE]


def test_run3_hard_kill_without_notices():
    run3 = select_run(load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv")), "us-east1-c-run3")
    start = 1_800_000_000.0
    provider = TraceProvider(run3, HOSTS, start_time=start, time_scale=60, notice_seconds=30, notices=False)
    revoke_at = start + 1454.486057 / 60
    just_before = provider.poll(revoke_at - 0.001)[1]
    assert (just_before.state, just_before.notice_at, just_before.terminate_at) == (USABLE, None, None)
    assert provider.poll(revoke_at - 0.4)[1].state == USABLE  # inside what would have been the notice window
    gone = provider.poll(revoke_at)[1]
    assert gone.state == GONE and gone.notice_at is None and gone.terminate_at == pytest.approx(revoke_at)


def test_notice_never_before_start_and_extra_hosts_ignored(tmp_path):
    trace = tmp_path / "early.csv"
    trace.write_text("VM_name,Uptime,Revoked\nr1-master,100,Job completed\nr1-worker-0,10,Revoked\n")
    run = select_run(load_trace(trace), 1)
    provider = TraceProvider(run, HOSTS, start_time=500.0, time_scale=1.0, notice_seconds=120)
    [revocation] = provider.revocations()
    assert (revocation.notice_at, revocation.revoke_at) == (500.0, 510.0)
    assert [h.state for h in provider.poll(500.0)] == [USABLE, NOTICED]


def test_provider_rejects_bad_arguments():
    run3 = select_run(load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv")), 3)
    with pytest.raises(ProviderError, match="needs 4 hosts, but got 2"):
        TraceProvider(run3, HOSTS[:2], start_time=0.0)
    with pytest.raises(ProviderError, match="repeat a name"):
        TraceProvider(run3, ["localhost"] * 4, start_time=0.0)
    with pytest.raises(ValueError, match="time_scale is 0"):
        TraceProvider(run3, HOSTS, start_time=0.0, time_scale=0)
    with pytest.raises(ValueError, match="notice_seconds is -1"):
        TraceProvider(run3, HOSTS, start_time=0.0, notice_seconds=-1)
    with pytest.raises(ValueError, match="slots is 0"):
        TraceProvider(run3, HOSTS, start_time=0.0, slots=0)


# ---- broken trace files -------------------------------------------------------------------------

GOOD_LINES = ["VM_name,Uptime,Revoked", "mine-run1-master,3600,Job completed", "mine-run1-worker-0,1454.5,Revoked"]


def write_trace(tmp_path, *lines, name="k80.csv"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message
    assert message.endswith(".")


def test_users_own_trace_in_the_documented_format(tmp_path):
    runs = load_trace(write_trace(tmp_path, *GOOD_LINES, "MINE-RUN2-master,50,JOB COMPLETED"))
    assert list(runs) == ["mine-run1", "MINE-RUN2"]
    assert [v.vm for v in runs["mine-run1"].revoked_vms()] == ["mine-run1-worker-0"]


@pytest.mark.parametrize("lines, message", [
    (["VM_name,Uptime", "r-master,1,Revoked"], r"trace k80\.csv has no column 'Revoked'"),
    (["VM,Uptime,Revoked", "r-master,1,Revoked"], r"trace k80\.csv has no column 'VM_name'"),
    (GOOD_LINES + ["", "mine-run2-master,abc,Revoked"], r"trace k80\.csv line 5: Uptime 'abc' is not a number of seconds\."),
    (GOOD_LINES + ["mine-run2-master,nan,Revoked"], r"line 4: Uptime 'nan' is not a number"),
    (GOOD_LINES + ["mine-run2-master,-3,Revoked"], r"trace k80\.csv line 4: Uptime -3 is negative"),
    (GOOD_LINES + ["mine-run2-master,3,Preempted"], r"line 4: Revoked 'Preempted' is not one of 'Job completed', 'Revoked'"),
    (GOOD_LINES + ["mine-run2-ps,3,Revoked"], r"line 4: VM_name 'mine-run2-ps' does not end in -master or -worker-<number>"),
    (GOOD_LINES + ["mine-run2-worker-x,3,Revoked"], r"line 4: VM_name"),
    (GOOD_LINES + ["mine-run1-worker-0,3,Revoked"], r"line 4: VM 'mine-run1-worker-0' appears a second time"),
    (GOOD_LINES + ["mine-run2-master"], r"line 4: it has 1 fields"),
    (GOOD_LINES + ["mine-run2-worker-0,3,Revoked"], r"run 'mine-run2' has no mine-run2-master line"),
    (GOOD_LINES + ["mine-run1-worker-2,3,Revoked"], r"run 'mine-run1' has no mine-run1-worker-1 line"),
    (["VM_name,Uptime,Revoked"], r"trace k80\.csv has a header but no VM lines"),
])
def test_broken_trace_is_one_sentence(tmp_path, lines, message):
    with pytest.raises(ProviderError, match=message) as e:
        load_trace(write_trace(tmp_path, *lines))
    one_sentence(str(e.value))


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ProviderError, match=r"trace empty\.csv is empty") as e:
        load_trace(empty)
    one_sentence(str(e.value))
    with pytest.raises(ProviderError, match=r"nowhere\.csv does not exist") as e:
        load_trace(tmp_path / "nowhere.csv")
    one_sentence(str(e.value))
    with pytest.raises(ProviderError, match="is a directory"):
        load_trace(tmp_path)


def test_select_run_rejects_unknown_runs():
    runs = load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv"))
    for number in (0, 33, "33"):
        with pytest.raises(ProviderError, match="this trace has 32 runs, numbered 1 to 32") as e:
            select_run(runs, number)
        one_sentence(str(e.value))
    with pytest.raises(ProviderError, match=r"run 'us-east1-c-run99' is not in this trace.*us-east1-c-run1, ") as e:
        select_run(runs, "us-east1-c-run99")
    one_sentence(str(e.value))
    assert select_run(runs, 32).run_id == list(runs)[-1]


def test_importing_the_trace_provider_loads_no_torch_or_horovod():
    code = "import transientvod.spot.providers.trace, sys; assert 'torch' not in sys.modules and 'horovod' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
