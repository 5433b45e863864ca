"""The wheel installs anywhere: built from an sdist of this working tree, installed (not
editable) into a fresh venv, it builds its Horovod (`transientvod install-horovod`), runs the
demo and a trace-replay discovery from a folder outside the checkout, with no checkout on
sys.path.

What is cached: the fresh venv's third-party packages (pip, torch at this venv's version and
every requirement the wheel declares) are installed once per key into
$TRANSIENTVOD_CACHE/wheel-test/site-KEY (about a gigabyte, minutes the first time) and reach the
fresh venv (made without pip or setuptools of its own, which would shadow them) through a .pth
file, as a venv's own site-packages would; transientvod itself, its console script and Horovod
(the cached wheel install_horovod.sh built) go into the fresh venv on every run. Everything else
the test makes lives under tmp_path and is removed at its end."""
from __future__ import annotations

import contextlib
import email.parser
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, explain

import transientvod

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("TRANSIENTVOD_CACHE", Path.home() / ".cache" / "transientvod")) / "wheel-test"
# The files the runtime reads, which only package data brings along.
SHIPPED = ["transientvod/configs/demo.yaml", "transientvod/launch/spot_hosts.py", "transientvod/launch/local_hosts.py",
           "transientvod/launch/testbed_hosts.py", "transientvod/launch/token_hosts.py",
           "transientvod/launch/install_horovod.sh",
           "transientvod/launch/horovod-0.28.1-transient.patch", "transientvod/csrc/cuda/compress.cuh",
           "transientvod/csrc/setup_extension.py", "transientvod/spot/traces/gce-2019/k80_spot_2workers_vm_trace.csv"]
DEMO_STEPS = 200
# Each demo step sleeps this long, so that the 80 steps after the host's return at 60 % outlast
# its new worker's start (torch's import and the rendezvous: seconds, more on a loaded machine).
DEMO_STEP_SECONDS = "0.2"


def run(argv, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on a timeout the whole tree goes (horovodrun's workers)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} did not end within {timeout} s\n{out[-4000:]}\n{err[-6000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def build_wheel(work: Path) -> Path:
    """sdist of the working tree (its files as git sees them, committed or not), then the wheel
    from the sdist, as an index's build would: a file MANIFEST.in forgets is missing from both."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.split("\0")
    source = work / "source"
    for name in filter(None, listed):
        if (REPO / name).is_file():  # a tracked file deleted in the working tree is listed too
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = work / "dist"
    env = {**os.environ, "TRANSIENTVOD_BUILD_CUDA": "0"}  # the wheel for every host; no minutes of nvcc
    done = run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"],
               timeout=300, cwd=source, env=env)
    assert done.returncode == 0, explain(done)
    [sdist] = dist.glob("transientvod-*.tar.gz")
    done = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist),
                str(sdist)], timeout=300, cwd=work, env=env)
    assert done.returncode == 0, explain(done)
    [wheel] = dist.glob("transientvod-*.whl")
    return wheel


def requirements(wheel: Path) -> list[str]:
    """The wheel's own Requires-Dist, without the extras' (test)."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return sorted(r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r)


def third_party_site(wheel: Path) -> Path:
    """A directory with pip, torch (this venv's version: the cached Horovod wheel is built for it)
    and the wheel's requirements, installed once per (Python, torch, requirements)."""
    import torch

    wanted = ["pip", f"torch=={torch.__version__}"] + [r for r in requirements(wheel) if not r.startswith("torch")]
    key = hashlib.sha256(json.dumps([sys.version_info[:2], wanted]).encode()).hexdigest()[:12]
    site = CACHE / f"site-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same directory: wait for it
        if not (site / ".complete").exists():
            for old in CACHE.glob("site-*"):  # an earlier key's (or a build that died): gigabytes
                shutil.rmtree(old)
            partial = CACHE / f"site-{key}.partial"
            # --target installs everything it is given, whatever this venv has already.
            done = run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(partial), *wanted],
                       timeout=900)
            assert done.returncode == 0, explain(done)
            (partial / ".complete").write_text("\n".join(wanted) + "\n")
            partial.rename(site)
    return site


def fresh_venv(path: Path, site: Path) -> Path:
    """A new venv whose interpreter also sees `site`, the way it sees its own site-packages (its
    .pth files run too); returns its bin/. Without pip: the venv's own pip and setuptools would
    come first on sys.path, and torch asks for a newer setuptools than Python bundles."""
    done = run([sys.executable, "-m", "venv", "--without-pip", str(path)], timeout=120)
    assert done.returncode == 0, explain(done)
    python = path / "bin" / "python"
    own_site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], timeout=60)
    (Path(own_site.stdout.strip()) / "transientvod-wheel-test.pth").write_text(
        f"import site; site.addsitedir({str(site)!r})\n")
    return path / "bin"


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)  # the venv, the wheel, the demo's runs: nothing stays


@pytest.mark.timeout(1800)  # the first run installs torch and the requirements into the cache
def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo_and_discovery_outside_the_checkout(workdir):
    wheel = build_wheel(workdir / "build")
    with zipfile.ZipFile(wheel) as archive:
        assert not set(SHIPPED) - set(archive.namelist())

    bin_dir = fresh_venv(workdir / "venv", third_party_site(wheel))
    python = str(bin_dir / "python")
    elsewhere = workdir / "elsewhere"  # no checkout here or above
    elsewhere.mkdir()
    assert REPO not in elsewhere.parents
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(bin_dir.parent))

    def in_venv(*argv, timeout=120, **extra_env):
        return run(list(argv), timeout=timeout, cwd=elsewhere, env={**env, **extra_env})

    # Not editable, all requirements met without an index.
    done = in_venv(python, "-m", "pip", "install", "--quiet", "--no-index", str(wheel), timeout=300)
    assert done.returncode == 0, explain(done)
    done = in_venv(python, "-c", "import json, sys, transientvod; print(json.dumps([transientvod.__file__, sys.path]))")
    assert done.returncode == 0, explain(done)
    package_file, path = json.loads(done.stdout)
    assert Path(package_file).is_relative_to(workdir / "venv"), package_file
    assert not [p for p in path if p and Path(p).resolve().is_relative_to(REPO)], path

    done = in_venv(str(bin_dir / "transientvod"), "--version")
    assert done.returncode == 0 and done.stdout == f"transientvod {transientvod.__version__}\n", explain(done)
    # A run's commit tag is the package's checkout's, not that of a repository the venv sits in.
    subprocess.run(["git", "init", "-q", str(workdir)], check=True, timeout=30)
    done = in_venv(python, "-c", "from transientvod.tracking.run import git_commit; print(git_commit())")
    assert done.returncode == 0 and done.stdout == "unknown\n", explain(done)

    # The packaged build script, run with the venv's Python: the cached wheel, in seconds.
    done = in_venv(str(bin_dir / "transientvod"), "install-horovod", timeout=900)
    assert done.returncode == 0, explain(done)
    assert "is installed with PyTorch and Gloo" in done.stdout, explain(done)
    assert (bin_dir / "horovodrun").exists()

    # The demo: two local hosts, one revoked at 30 % and back at 60 %, with the packaged config
    # and the packaged local_hosts discovery.
    done = in_venv(str(bin_dir / "transientvod"), "demo", "--set", f"train.steps={DEMO_STEPS}", "--set",
                   "train.eval_every=100", timeout=420, TRANSIENTVOD_STEP_SECONDS=DEMO_STEP_SECONDS)
    assert done.returncode == 0, explain(done)
    summary = json.loads((elsewhere / "runs" / "demo" / "summary.json").read_text())
    assert summary["steps"] == DEMO_STEPS
    assert summary["world_sizes_seen"] == [2, 1, 2], explain(done)
    assert "revocations survived  1" in done.stdout

    # A trace replayed by the watcher, read by the discovery command it prints (the packaged
    # spot_hosts module): both hosts, then one when worker-0's notice comes.
    state = elsewhere / "hosts.json"
    config = elsewhere / "watch.yaml"
    config.write_text(yaml.safe_dump({"spot": {
        "provider": "trace", "trace": "k80_spot_2workers_vm_trace.csv", "trace_run": "spot2-us-east1-c-run1",
        "hosts": "hostA,hostB", "state_file": str(state), "poll_seconds": 0.1,
        # worker-0's notice comes at 911.8 s of trace time: 4 s of real time (x50) after the start
        "time_scale": 50.0, "start_at": 711.8}}))
    watcher_log = open(elsewhere / "watch.log", "w")  # its log lines, a file: a full pipe would stop it
    watcher = subprocess.Popen([str(bin_dir / "transientvod"), "watch", "--config", str(config)], cwd=elsewhere,
                               env=env, stdout=subprocess.PIPE, stderr=watcher_log, text=True, start_new_session=True)
    seen = []
    try:
        first_line = watcher.stdout.readline()
        discovery = first_line.partition("discovery: ")[2].strip()
        assert discovery.startswith(f"{python} -m transientvod.launch.spot_hosts --state-file "), first_line
        deadline = time.monotonic() + 60
        while "hostA:1\n" not in seen and time.monotonic() < deadline:
            if state.exists():
                done = in_venv("bash", "-c", discovery, timeout=30)
                assert done.returncode == 0, explain(done)
                if not seen or seen[-1] != done.stdout:
                    seen.append(done.stdout)
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(watcher.pid, signal.SIGINT)
        try:
            watcher.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(watcher.pid, signal.SIGKILL)
            watcher.communicate()
        watcher_log.close()
    assert seen == ["hostA:1\nhostB:1\n", "hostA:1\n"], seen
