"""Shared pieces for tests that start real `horovodrun` jobs through the CLI."""
from __future__ import annotations

import ast
import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml


def default_sighup() -> None:
    """For a child process: SIGHUP back to its default, as a login shell starts a command. A test
    run under nohup (or a CI runner that ignores SIGHUP) would otherwise pass the ignored SIGHUP
    on, and the command, rightly, keeps it ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


REPO = Path(__file__).resolve().parents[1]
TRANSIENTVOD = [sys.executable, "-m", "transientvod.cli"]
LOCAL_HOSTS = f"{sys.executable} {REPO / 'launch' / 'local_hosts.py'}"

# A tiny job: ResNet-8 of width 4 on the digits, so each step takes milliseconds.
TINY_JOB = {
    "model": {"depth": 8, "width": 4},
    "data": {"batch_size": 16},
    "optimizer": {"lr": 0.05, "warmup_steps": 0, "schedule": "constant"},
    "train": {"steps": 300, "commit_every": 10, "checkpoint_every": 50, "log_every": 10, "threads_per_worker": 1},
    "cluster": {"min_np": 1, "max_np": 2, "elastic_timeout": 30},
}


# Hosts join and leave through Horovod's discovery, which it polls once a second, so a change
# takes a second or two to reach the workers. Every step of a test job sleeps this long (the
# benchmarks' TRANSIENTVOD_STEP_SECONDS), so that a quick machine cannot finish a job's last
# few hundred steps before a scheduled host change arrives.
TEST_STEP_SECONDS = "0.01"

# A replayed revocation comes on the replay's clock, a fixed number of seconds after the
# workers start, and the job must still be training then and for the removal after it. Only
# a floor holds on a machine of any speed: steps that each sleep long enough cannot all be
# done before the event. The margin covers a removal (2-6 s here under load) and the record
# written after it.
OUTLAST_MARGIN_SECONDS = 15.0


def step_seconds_to_outlast(event_seconds: float, steps: int) -> float:
    """A step's sleep that keeps `steps` steps training until OUTLAST_MARGIN_SECONDS after an event
    `event_seconds` after the start."""
    return (event_seconds + OUTLAST_MARGIN_SECONDS) / steps


def job_environment(step_seconds: float = 0.0) -> dict:
    """The environment of a test job: each step sleeps TEST_STEP_SECONDS, or `step_seconds` if longer."""
    default = float(os.environ.get("TRANSIENTVOD_STEP_SECONDS", TEST_STEP_SECONDS))
    return {**os.environ, "TRANSIENTVOD_STEP_SECONDS": f"{max(default, step_seconds):g}"}


class Job:
    """One job's config file and run directory."""

    def __init__(self, tmp_path: Path, name: str, step_seconds: float = 0.0, **sections):
        config = json.loads(json.dumps(TINY_JOB))
        if "tracking" not in sections:
            # MLflow costs every job seconds of CPU (its import in the launcher and in rank 0,
            # its store, its sends) that only the tests about tracking look at: they name a
            # tracking section (tracking={"enabled": True} at least), the others go without.
            config["tracking"] = {"enabled": False}
        for section, values in sections.items():
            if isinstance(values, dict):
                config.setdefault(section, {}).update(values)
            else:  # a top-level key that is not a section: task
                config[section] = values
        config["run"] = {"name": name, "output_dir": str(tmp_path / "runs")}
        tracking = config.get("tracking", {})
        if tracking.get("enabled", True) and not tracking.get("uri") and "MLFLOW_TRACKING_URI" not in os.environ:
            seed_mlflow_store(tmp_path / "runs" / "mlflow.db")
        self.config = config
        self.step_seconds = step_seconds  # see job_environment
        self.run_dir = tmp_path / "runs" / name
        self.config_path = tmp_path / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))

    def discovery(self, *phases: str) -> str:
        """A local_hosts.py command whose phases follow this job's progress."""
        args = " ".join(f"--phase {p}" for p in phases)
        return f"{LOCAL_HOSTS} {args} --progress {self.run_dir / 'metrics.jsonl'}"

    def argv(self, discovery: str | None) -> list[str]:
        argv = TRANSIENTVOD + ["train", "--config", str(self.config_path)]
        return argv + ["--discovery", discovery] if discovery else argv

    def run(self, discovery: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
        # Its own session: on a timeout, horovodrun and every worker are killed with it,
        # so a hung job cannot keep loading the machine for the tests after it.
        proc = subprocess.Popen(self.argv(discovery), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO, start_new_session=True, env=job_environment(self.step_seconds))
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"the job did not finish within {timeout} s\n--- stdout ---\n{stdout[-3000:]}\n"
                        f"--- stderr ---\n{stderr[-8000:]}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def start(self, discovery: str, log_path: Path) -> subprocess.Popen:
        # Its own session, so a test can kill horovodrun and every worker at once.
        log = open(log_path, "w")
        return subprocess.Popen(self.argv(discovery), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, env=job_environment(self.step_seconds),
                                preexec_fn=default_sighup)

    def rows(self, name: str) -> list[dict]:
        path = self.run_dir / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def last_step(self) -> int:
        steps = [row["step"] for row in self.rows("metrics.jsonl")]
        return max(steps, default=0)


def run_probe(probe: str, world: int, *args: str) -> list[dict]:
    """Run tests/probes/<probe> under `horovodrun -np world` on this host; the JSON line each rank printed."""
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    done = subprocess.run([horovodrun, "-np", str(world), "-H", f"localhost:{world}", "--gloo",
                           sys.executable, str(REPO / "tests" / "probes" / probe), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, explain(done)
    return probe_rows(done.stdout)


def probe_rows(output: str) -> list[dict]:
    """The JSON lines that ranks printed, from horovodrun's "[rank]<stdout>:" prefixed output."""
    rows = []
    for line in output.splitlines():
        _, _, text = line.partition(">:")
        if text.startswith("{"):
            rows.append(json.loads(text))
    return rows


def heavy_modules_imported(*modules: str) -> list[str]:
    """The torch and horovod modules that importing `modules` pulls in, in a fresh interpreter
    (the watcher, discovery and planner must start without them: seconds of import, a GPU)."""
    code = (f"import json, sys, {', '.join(modules)}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def explain(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-6000:]}"


@pytest.fixture
def job(tmp_path):
    return lambda name="job", **sections: Job(tmp_path, name, **sections)


os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def moto_aws(config_dir: Path):
    """A moto server on 127.0.0.1 (never 0.0.0.0) and an environment that points boto3 at it
    with fake credentials; nothing of the developer's own AWS setup leaks in. Yields the URL.
    The credentials are in the environment and in a credentials file: a job's workers get only
    the file's path (the launcher keeps credentials out of horovodrun's environment)."""
    from moto.server import ThreadedMotoServer

    empty = config_dir / "empty-aws-config"
    empty.write_text("")
    credentials = config_dir / "fake-aws-credentials"
    credentials.write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION",
                         "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRANSIENTVOD_S3_MAX_ATTEMPTS"):
                env.delenv(name, raising=False)
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            env.setenv("AWS_DEFAULT_REGION", "us-east-1")
            env.setenv("AWS_EC2_METADATA_DISABLED", "true")
            env.setenv("AWS_CONFIG_FILE", str(empty))
            env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
            yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ec2_moto(tmp_path_factory):
    """(url, ami, session) of a moto server for the EC2 and SQS tests of one module."""
    import boto3

    with moto_aws(tmp_path_factory.mktemp("aws")) as url:
        # One session for the module: it loads each service's model once, which takes seconds.
        session = boto3.session.Session()
        # moto's catalogue of AMIs is the same after every reset; look one up once (it is slow).
        ami = session.client("ec2", endpoint_url=url).describe_images(MaxResults=5)["Images"][0]["ImageId"]
        yield url, ami, session


def reset_moto(url: str) -> None:
    """Forget every resource: a fresh account for the next test."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).read()


def mlflow_browser():
    """docs/mlflow_screenshot.py (not a package): `mlflow server` and headless Chromium."""
    import importlib.util

    path = REPO / "docs" / "mlflow_screenshot.py"
    spec = importlib.util.spec_from_file_location("mlflow_screenshot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seed_mlflow_store(path: Path) -> None:
    """An empty MLflow store at `path` (the job's default store), unless one is there: a copy of
    one made once per session. MLflow makes a new SQLite store by running every schema migration
    since its first release (3.7 s on this machine when idle, 9 s under load), which every job would pay in its
    launcher before it starts; the copy is at MLflow's current schema, so MLflow opens it as is.
    Making a store from nothing is tested where that is the point (tests/tracking)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_empty_mlflow_store(), path)


@functools.lru_cache(maxsize=None)
def _empty_mlflow_store() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="transientvod-empty-mlflow-"))
    new_mlflow_store(directory)
    atexit.register(shutil.rmtree, directory, True)
    return directory / "mlflow.db"


def new_mlflow_store(directory: Path) -> str:
    """A real, empty SQLite MLflow store; returns its URI."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{directory / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # creates the tables
    return uri


def wait_until(predicate, timeout: float, what: str, proc=None) -> None:
    """Poll `predicate` until it holds; a failure after `timeout` s, or as soon as `proc` (a
    job's process, if given) has ended without it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def transientvod_imports(path: Path) -> set[str]:
    """The transientvod modules a source file imports (absolute imports only: the house has
    no relative ones, and a relative import fails the test that asks)."""
    return {name for name in imported_modules(path) if name == "transientvod" or name.startswith("transientvod.")}


def imported_modules(path: Path) -> set[str]:
    """Every module a source file names in an import statement, read from its syntax tree."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found.add(node.module)
    return found


HEAVY_MODULES = {"torch", "horovod", "numba"}


def assert_package_imports(package: Path, allowed: dict[str, set[str]], heavy_allowed: bool = False) -> None:
    """Each module of `package` imports from transientvod only what `allowed[its stem]` lists
    (a new module must be added there), and, unless `heavy_allowed`, none of torch, horovod or
    numba."""
    modules = {path.stem: path for path in package.glob("*.py")}
    assert set(modules) == set(allowed), "a new module: say what it may import"
    for stem, path in modules.items():
        assert transientvod_imports(path) <= allowed[stem], stem
        if not heavy_allowed:
            assert not {name.split(".")[0] for name in imported_modules(path)} & HEAVY_MODULES, stem


# -- shared by test folders: bad input through the real CLI (cli/, tasks/) ---------------------

GOOD_DISCOVERY = f"{LOCAL_HOSTS} --hosts localhost:1"


def run_train(tmp_path, config: dict, discovery: str = GOOD_DISCOVERY, config_path=None):
    config = {"run": {"name": "bad", "output_dir": str(tmp_path / "runs")}, **config}
    if config_path is None:
        config_path = tmp_path / "job.yaml"
        config_path.write_text(yaml.safe_dump(config))
    return subprocess.run(TRANSIENTVOD + ["train", "--config", str(config_path), "--discovery", discovery],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def assert_one_sentence(done, *fragments):
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("transientvod: ") and lines[0].endswith("."), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_nothing_written(tmp_path):
    assert not (tmp_path / "runs" / "bad" / "checkpoints").exists()


# -- shared by the job tests of worker/ and head/ -----------------------------------------------

BOTH = "localhost:1,127.0.0.1:1"  # two hosts to Horovod, both this machine: a host can leave without ssh
