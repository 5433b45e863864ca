""".venv/bin/python docs/mlflow_screenshot.py --backend-store-uri sqlite:///runs/mlflow.db --out runs/mlflow-compare.png --height 2300

makes a screenshot of MLflow's run-compare view (the cost page, docs/cost.md, shows compare's own
cost-against-accuracy figure instead: docs/compare_figure.py): it serves the store with
`mlflow server` on 127.0.0.1, opens the compare view of the experiment's newest runs (at most
10; `--runs ID ...` picks them, `--experiment` another experiment) in headless Chromium and
prints the PNG's path. tests/tracking/test_mlflow_ui.py uses the same pieces to read a run's page.

It needs Debian's `chromium` package and nothing else (no chromedriver, no selenium):
Chromium's own `--dump-dom` and `--screenshot` switches with a virtual-time budget are the
whole browser driver. MLflow's UI is a React single-page app that fetches its data with XHR
after the page loads; under `--virtual-time-budget` the page's clock stands still while a
request is in flight, so the DOM or the shot is taken after the answers have been drawn.

docs/ is not a package: tests import this file by its path.
"""
from __future__ import annotations

import argparse
import contextlib
import html.parser
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

# The browser: a name on PATH or a path.
CHROMIUM = os.environ.get("TRANSIENTVOD_CHROMIUM", "chromium")
# Milliseconds of page time Chromium lets pass before it dumps the DOM or takes the shot. Page
# time stands still while a request is in flight and races ahead when the page is idle, so a
# budget costs wall time only for what the page really does (1.5-3 s for MLflow's pages);
# 500 was already enough here, 10000 costs no more. It must be positive: with 0 (no budget)
# --dump-dom of a run page never returned.
VIRTUAL_TIME_BUDGET_MS = int(os.environ.get("TRANSIENTVOD_CHROMIUM_BUDGET_MS", "10000"))
# One Chromium run takes 1.5-7 s; one that has not finished after this long never will.
ATTEMPT_SECONDS = float(os.environ.get("TRANSIENTVOD_CHROMIUM_ATTEMPT_SECONDS", "30"))
# How long `mlflow server` may take to answer /health (it takes 3-5 s).
SERVER_START_SECONDS = float(os.environ.get("TRANSIENTVOD_MLFLOW_START_SECONDS", "60"))
# The name the screenshot's browser calls the server by. MLflow 3.17's UI opens its Assistant
# side panel on the first visit to localhost or 127.0.0.1 (and a fresh browser profile is
# always a first visit); it would cover a quarter of the shot. Chromium resolves every
# *.localhost name to loopback by itself (and CHROMIUM_FLAGS pins it to 127.0.0.1).
SCREENSHOT_HOSTNAME = "mlflow.localhost"
MAX_COMPARED_RUNS = 10

CHROMIUM_FLAGS = [
    "--headless",
    # The only pages loaded are the local MLflow UI's; containers (and root) have no sandbox.
    "--no-sandbox",
    "--disable-gpu",
    # Chromium's own traffic (updates, sync, field trials, QUIC) has nowhere to go on a machine
    # without outbound network; without these flags it was seen failing connections in bursts.
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP *.localhost 127.0.0.1",
]


class UserError(Exception):
    """Something the person running the script can fix; its message is one sentence."""


# -- the server --------------------------------------------------------------------------------

def _free_port(port: int = 0) -> int:
    """`port` if nothing listens on it (else OSError), or any free port for 0."""
    with socket.socket() as sock:
        # As uvicorn binds: a port whose old connections linger in TIME_WAIT (a server just
        # stopped, to be started again on the same port) is free to it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as e:
            # Another server there would answer /health in our server's place.
            raise OSError(f"port {port} of 127.0.0.1 is taken ({e.strerror}); pick another or none.") from None
        return sock.getsockname()[1]


def _sqlite_file(backend_store_uri: str) -> Path:
    if not backend_store_uri.startswith("sqlite:///"):
        raise ValueError(f"{backend_store_uri} is not a sqlite:/// URI; only SQLite stores are served here.")
    return Path(backend_store_uri[len("sqlite:///"):])


def _log_tail(log_path: Path, lines: int = 15) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(the server wrote nothing)"


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
            return reply.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _stop(server: subprocess.Popen) -> None:
    # `mlflow server` is a parent that starts uvicorn: signal the whole process group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # whatever of the group is still there
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


@contextlib.contextmanager
def serve_mlflow(backend_store_uri: str, port: int | None = None, *,
                 browser_hostname: str | None = None) -> Iterator[str]:
    """Run `mlflow server` on 127.0.0.1 for an existing SQLite store; yields its base URL
    ("http://127.0.0.1:PORT"), stops it (and its workers) on exit.

    browser_hostname: another name a browser may call the server by (e.g.
    SCREENSHOT_HOSTNAME); MLflow's security middleware then accepts that Host header and that
    origin too, and nothing else beyond its defaults. The server still listens on 127.0.0.1 only.
    """
    db = _sqlite_file(backend_store_uri).resolve()
    if not db.is_file():
        # `mlflow server` would create an empty store there and show nothing.
        raise FileNotFoundError(f"the MLflow store {db} does not exist; log a run first or pass "
                                "the --backend-store-uri of an existing store.")
    port = _free_port(port or 0)
    command = [sys.executable, "-m", "mlflow", "server",
               "--backend-store-uri", f"sqlite:///{db}",
               # Where artifacts logged through this server go: next to the database, as
               # transientvod.tracking keeps them (the default is ./mlartifacts of the cwd).
               "--artifacts-destination", str(db.parent / "mlartifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    # 127.0.0.1 and localhost pass MLflow's Host-header and CORS checks by default; another
    # name must be allowed explicitly, or the UI's POSTs (run search) are refused.
    if browser_hostname:
        command += ["--allowed-hosts", f"127.0.0.1:{port},localhost:{port},{browser_hostname}:{port}",
                    "--cors-allowed-origins", f"http://{browser_hostname}:{port}"]
    environment = {**os.environ,
                   "MLFLOW_DISABLE_TELEMETRY": "true",
                   # The job runner (GenAI evaluation jobs, periodic tasks) is seven more
                   # processes and a directory in /dev/shm; showing runs needs none of it.
                   "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="mlflow-server-") as scratch:
        log_path = Path(scratch) / "server.log"
        with open(log_path, "wb") as log:
            # A file, not a pipe: nobody reads the server's output while it runs. Its own
            # session: one signal reaches uvicorn too. The scratch dir as cwd: nothing lands
            # in the caller's directory.
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=scratch, env=environment, start_new_session=True)
        try:
            deadline = time.monotonic() + SERVER_START_SECONDS
            while not _healthy(base):
                if server.poll() is not None:
                    raise RuntimeError(f"mlflow server exited with status {server.returncode} before it answered "
                                       f"{base}/health; its last lines:\n{_log_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mlflow server did not answer {base}/health within {SERVER_START_SECONDS:g} s; "
                                       f"its last lines:\n{_log_tail(log_path)}")
                time.sleep(0.2)
            yield base
        finally:
            _stop(server)


# -- the browser -------------------------------------------------------------------------------

def _chromium() -> str:
    path = shutil.which(CHROMIUM)
    if path is None:
        raise FileNotFoundError(f"headless Chromium ({CHROMIUM}) is not installed; install Debian's chromium "
                                "package or set TRANSIENTVOD_CHROMIUM to its path.")
    return path


def _run_chromium_once(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    # A fresh profile: no state (local storage, cache) from an earlier page. Its own session,
    # so that a timeout kills its renderer, GPU and crash-handler processes too.
    with tempfile.TemporaryDirectory(prefix="chromium-profile-", ignore_cleanup_errors=True) as profile:
        command = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        # Its crash handler would make ~/.config/chromium/Crash Reports; keep it in the profile.
        environment = {**os.environ, "BREAKPAD_DUMP_LOCATION": str(Path(profile) / "crashes")}
        browser = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, env=environment, start_new_session=True)
        try:
            stdout, stderr = browser.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(browser.pid, signal.SIGKILL)
            browser.communicate()
            raise TimeoutError(f"Chromium did not finish {args[-1]} within {timeout:g} s") from None
        with contextlib.suppress(ProcessLookupError):  # a helper process left behind
            os.killpg(browser.pid, signal.SIGKILL)
    if browser.returncode != 0:
        raise RuntimeError(f"Chromium exited with status {browser.returncode} on {args[-1]}:\n"
                           + _chromium_errors(stderr))
    return subprocess.CompletedProcess(command, browser.returncode, stdout, stderr)


def _run_chromium(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Chromium with `args`; a run that hangs (one screenshot in about 150 did here) is killed
    after ATTEMPT_SECONDS and started again, until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return _run_chromium_once(args, min(ATTEMPT_SECONDS, left))
        except TimeoutError:
            if deadline - time.monotonic() < 1:
                raise TimeoutError(f"Chromium did not finish {args[-1]} within {timeout:g} s") from None


def _chromium_errors(stderr: bytes) -> str:
    # Chromium logs D-Bus and GPU complaints on every start; they are never the cause.
    lines = [line for line in stderr.decode(errors="replace").splitlines()
             if "dbus" not in line and "unexpected operator" not in line]
    return "\n".join(lines[-15:])


def _render(url: str, extra_args: list[str], timeout: float) -> str:
    """Load `url` in a fresh headless Chromium; the DOM once the page's time budget is spent."""
    done = _run_chromium([*extra_args, "--dump-dom", f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}", url],
                         timeout)
    return done.stdout.decode("utf-8", errors="replace")


def chromium_dom(url: str, timeout: float = 60) -> str:
    """The page's DOM (HTML) after its scripts ran and its requests were answered."""
    return _render(url, [], timeout)


class _TextOfPage(html.parser.HTMLParser):
    HIDDEN = ("script", "style", "noscript", "template")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.HIDDEN:
            self._hidden += 1

    def handle_endtag(self, tag):
        if tag in self.HIDDEN and self._hidden:
            self._hidden -= 1

    def handle_data(self, data):
        if not self._hidden and data.strip():
            self.parts.append(data.strip())


def page_text(dom: str) -> str:
    """What the page shows as text: its text nodes, one space apart, without scripts and styles."""
    parser = _TextOfPage()
    parser.feed(dom)
    return " ".join(parser.parts)


def _render_until(url: str, text: str, extra_args: list[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen, renderings = "(nothing: Chromium never finished the page)", 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{text!r} did not appear on {url} within {timeout:g} s ({renderings} renderings); "
                               f"the page showed:\n{seen[:3000]}")
        renderings += 1
        try:
            dom = _render(url, extra_args, left)
        except TimeoutError:
            continue
        seen = page_text(dom)
        if text in seen:
            return dom
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def wait_for_text(url: str, text: str, timeout: float = 60) -> str:
    """Render the page again and again until `text` is part of what it shows (page_text);
    returns that DOM. TimeoutError, with the text the page showed last, if it never is."""
    return _render_until(url, text, [], timeout)


def chromium_screenshot(url: str, path: str | os.PathLike, width: int = 1600, height: int = 1000, *,
                        wait_for: str | None = None, timeout: float = 60) -> Path:
    """A PNG of the page's first `width` x `height` CSS pixels, taken when its time budget is
    spent. With `wait_for`, taken again until the same rendering shows that text (as
    wait_for_text), so the shot cannot be of a page still waiting for its data."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    args = [f"--screenshot={path}", f"--window-size={width},{height}", "--hide-scrollbars",
            # every layer (the charts are WebGL and SVG) drawn into the frame that is captured
            "--run-all-compositor-stages-before-draw"]
    if wait_for is None:
        _render(url, args, timeout)
    else:
        _render_until(url, wait_for, args, timeout)
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError(f"Chromium exited without writing the screenshot {path}")
    return path


# -- MLflow UI routes (hash routes of MLflow 3.x's single-page app) ----------------------------

def run_page_url(base: str, experiment_id: str, run_id: str) -> str:
    """The run's page: its overview with params and the latest value of each metric."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _json_list(values: Sequence[str]) -> str:
    return urllib.parse.quote(json.dumps([str(v) for v in values], separators=(",", ":")), safe="")


def compare_page_url(base: str, experiment_id: str | Sequence[str], run_ids: Sequence[str]) -> str:
    """The compare-runs view of `run_ids` (from one experiment, or from a list of them)."""
    experiments = [experiment_id] if isinstance(experiment_id, (str, int)) else list(experiment_id)
    return f"{base.rstrip('/')}/#/compare-runs?runs={_json_list(run_ids)}&experiments={_json_list(experiments)}"


# -- the script --------------------------------------------------------------------------------

def _rest(base: str, endpoint: str, body: dict | None = None, **query) -> dict | None:
    """One call of MLflow's REST API; None for RESOURCE_DOES_NOT_EXIST (HTTP 404)."""
    url = f"{base}/api/2.0/mlflow/{endpoint}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def choose_runs(base: str, experiment: str, run_ids: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(experiment ids, run ids) to compare: the given runs, else the experiment's newest
    MAX_COMPARED_RUNS runs."""
    if run_ids:
        experiment_ids = []
        for run_id in run_ids:
            run = _rest(base, "runs/get", run_id=run_id)
            if run is None:
                raise UserError(f"there is no run {run_id} in the store; check the ids given to --runs.")
            if run["run"]["info"]["experiment_id"] not in experiment_ids:
                experiment_ids.append(run["run"]["info"]["experiment_id"])
        return experiment_ids, list(run_ids)
    found = _rest(base, "experiments/get-by-name", experiment_name=experiment)
    if found is None:
        raise UserError(f"the store has no experiment named '{experiment}'; pass the right --experiment.")
    experiment_id = found["experiment"]["experiment_id"]
    runs = _rest(base, "runs/search", {"experiment_ids": [experiment_id], "max_results": MAX_COMPARED_RUNS,
                                       "order_by": ["attributes.start_time DESC"]}).get("runs", [])
    if not runs:
        raise UserError(f"the experiment '{experiment}' has no runs yet; train something first.")
    return [experiment_id], [run["info"]["run_id"] for run in runs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot MLflow's run-compare view in headless Chromium.")
    parser.add_argument("--backend-store-uri", default="sqlite:///runs/mlflow.db",
                        help="the SQLite store the runs are in (default: %(default)s)")
    parser.add_argument("--experiment", default="transientvod", help="its experiment (default: %(default)s)")
    parser.add_argument("--runs", nargs="+", metavar="ID",
                        help=f"the runs to compare (default: the experiment's newest, at most {MAX_COMPARED_RUNS})")
    parser.add_argument("--out", default="runs/mlflow-compare.png", help="the PNG to write (default: %(default)s)")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        _chromium()
        if not args.backend_store_uri.startswith("sqlite:///"):
            raise UserError(f"--backend-store-uri {args.backend_store_uri} is not a sqlite:/// URI; "
                            "this script serves SQLite stores only.")
        with serve_mlflow(args.backend_store_uri, browser_hostname=SCREENSHOT_HOSTNAME) as base:
            experiment_ids, run_ids = choose_runs(base, args.experiment, args.runs)
            port = urllib.parse.urlsplit(base).port
            url = compare_page_url(f"http://{SCREENSHOT_HOSTNAME}:{port}", experiment_ids, run_ids)
            # The run details table lists the runs' ids once their data has come in.
            path = chromium_screenshot(url, args.out, args.width, args.height, wait_for=run_ids[0])
    except (UserError, FileNotFoundError) as e:
        print(f"mlflow_screenshot: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError, OSError) as e:  # the server, the browser, the --out file
        first, _, rest = str(e).partition("\n")
        print(f"mlflow_screenshot: {first}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
