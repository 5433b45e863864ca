"""Renders the benchmark rows under benchmarks/results/*.json into the results page.

    .venv/bin/python benchmarks/render_results.py            # rewrites the tables in docs/results.md
    .venv/bin/python benchmarks/render_results.py --check    # exits 1 if a table differs from its JSON

The page's prose is written by hand; each table on it sits between two markers,

    <!-- results: exchange.json 100mbit -->
    ... (made by this script: do not edit) ...
    <!-- /results -->

naming a file under benchmarks/results/ and a run's "id" in it (or its index from 0; "latest":
the file's last run).
A table is the run's "columns" and "rows", then one line saying where the numbers come from:
the command, the commit, the date and the machine. tests/test_docs.py runs --check, so a
figure on the page cannot drift from its JSON; a new measurement goes into the JSON (the
benchmark script appends its run) and this script puts it on the page.

A run is {"id", "title", "command", "date", "commit", "machine", "columns", "rows"}, and
optionally "summary" (lines under the table) and "recorded" (for rows converted from older
text that kept no commit or date: where and when they were first written down). The rows of
benchmarks/optimizers.py carry named fields instead of "columns"; OPTIMIZER_COLUMNS picks them.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "results.md"
MARKED = re.compile(r"(<!-- results: (\S+) (\S+) -->\n)(.*?)(<!-- /results -->)", re.S)

# benchmarks/optimizers.py's rows: (column, how to read it from a row)
OPTIMIZER_COLUMNS = [
    ("setting", lambda r: r["setting"]),
    ("optimizer", lambda r: r["optimizer"]),
    ("codec", lambda r: r["codec"]),
    ("s", lambda r: r["staleness"]),
    ("stale_lr", lambda r: str(r["stale_lr"]).lower()),
    ("final test loss", lambda r: f"{r['final_test_loss']:.4f}"),
    ("char accuracy %", lambda r: f"{100 * r['test_char_accuracy']:.2f}"),
    ("steps/s", lambda r: "-" if r["steps_per_s"] is None else f"{r['steps_per_s']:.2f}"),
    ("wall s", lambda r: f"{r['wall_s']:.0f}"),
]


# how a run's machine reads in its provenance line; other keys read "key value"
MACHINE_WORDS = {"cpus": "{} cores", "hosts": "{}", "gpu": "{}", "shared": "shared"}


class ResultsError(ValueError):
    """A marker names a file or a run that is not there; one sentence."""


def find_run(name: str, run_id: str) -> dict:
    path = RESULTS / name
    if not path.is_file():
        raise ResultsError(f"docs/results.md names {name}, which is not in benchmarks/results/.")
    document = json.loads(path.read_text())
    runs = [{"title": document["benchmark"], **run} for run in document["runs"]]  # a run's own title first
    if run_id == "latest":
        return runs[-1]
    if run_id.isdigit() and int(run_id) < len(runs):
        return runs[int(run_id)]
    for run in runs:
        if run.get("id") == run_id:
            return run
    raise ResultsError(f"benchmarks/results/{name} has no run with id {run_id!r}.")


def columns_and_rows(run: dict) -> tuple[list[str], list[list]]:
    if "columns" in run:
        return run["columns"], run["rows"]
    return [c for c, _ in OPTIMIZER_COLUMNS], [[read(r) for _, read in OPTIMIZER_COLUMNS] for r in run["rows"]]


def cell(value) -> str:
    return str(value).replace("|", "\\|")


def provenance(run: dict) -> str:
    machine = run.get("machine") or {}
    where = ", ".join(MACHINE_WORDS.get(k, k.replace("_", " ") + " {}").format(v) if not isinstance(v, bool)
                      else k.replace("_", " ") for k, v in machine.items() if v not in (None, False))
    parts = [f"`{run['command']}`" if run.get("command") else "command not recorded"]
    parts.append(f"commit {run['commit'][:7]}" if run.get("commit") else "commit not recorded")
    if run.get("date"):
        parts.append(run["date"][:10])
    if run.get("recorded"):
        r = run["recorded"]
        parts.append(f"first written down in {r['where']} at {r['commit']} ({r['date']})")
    if where:
        parts.append(where)
    return "; ".join(parts)


def render_run(run: dict) -> str:
    columns, rows = columns_and_rows(run)
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    out = "\n".join(lines) + "\n\n"
    for line in run.get("summary", []):
        out += line + "\n\n"
    if run.get("verdict"):
        v = run["verdict"]
        out += f"Verdict: ratio {v['ratio']:.4f} against a goal of at most {v['goal']}: {'met' if v['met'] else 'missed'}.\n\n"
    title = run["title"] + (f" ({run['settings']})" if isinstance(run.get("settings"), str) else "")
    return out + f"<small>{title}: {provenance(run)}.</small>\n"


def render(page: str) -> str:
    def table(match: re.Match) -> str:
        opening, name, run_id, _, closing = match.groups()
        return opening + render_run(find_run(name, run_id)) + closing
    return MARKED.sub(table, page)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table on the page differs from its JSON")
    args = parser.parse_args()
    page = PAGE.read_text()
    try:
        rendered = render(page)
    except ResultsError as e:
        print(f"render_results: {e}", file=sys.stderr)
        return 1
    if args.check:
        if rendered != page:
            print("docs/results.md differs from benchmarks/results/: run .venv/bin/python benchmarks/render_results.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
