"""A benchmark's worker job on this host: `horovodrun -np N -H localhost:N --gloo` running the
benchmark's own script with `--worker`, and the rows rank 0 prints as one `ROWS <json>` line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "ROWS "


def print_rows(rows: list) -> None:
    """The worker's side: rank 0's rows for the driver."""
    print(MARK + json.dumps(rows), flush=True)


def run_worker_job(script: str, ranks: int, arguments: list[str]) -> list | None:
    """Run `script --worker arguments` on `ranks` local ranks; rank 0's rows, or None (the job's
    output and one sentence printed) if the job failed or printed none."""
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    done = subprocess.run([horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
                           sys.executable, script, "--worker", *arguments],
                          capture_output=True, text=True, cwd=REPO)
    lines = [line.partition(MARK)[2] for line in done.stdout.splitlines() if MARK in line]
    if done.returncode != 0 or not lines:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        print(f"{Path(script).stem}: the horovodrun job failed (exit {done.returncode}); its output is above.",
              file=sys.stderr)
        return None
    return json.loads(lines[0])
