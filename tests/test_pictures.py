"""The pictures on the docs site: each is drawn again here from the data in the repository,
opened, and compared with the one committed under docs/ (same size), and each shows what its
data says (the colours of its marks are there; other data gives another picture)."""
from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, TRANSIENTVOD

DOCS = REPO / "docs"


def script(name: str):
    """A drawing script under docs/ (not a package), imported by its path."""
    sys.path.insert(0, str(DOCS))
    try:
        spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(DOCS))
    return module


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def colours(rgb: np.ndarray) -> int:
    return len(np.unique(rgb.reshape(-1, 3), axis=0))


def near(rgb: np.ndarray, colour: str, tolerance: int = 10) -> int:
    """How many pixels lie within `tolerance` of a matplotlib colour."""
    from matplotlib.colors import to_rgb

    target = np.array([round(255 * c) for c in to_rgb(colour)])
    return int(np.sum(np.all(np.abs(rgb.astype(int) - target) <= tolerance, axis=-1)))


def check_drawn_and_committed(path, committed, size):
    """The drawn picture has `size` and is no blank page; the committed one is there at that size."""
    with Image.open(path) as image:
        assert image.size == size
        assert "Software" not in image.info  # no matplotlib version: same data, same bytes
    assert colours(pixels(path)) > 50
    assert committed.is_file(), f"{committed} is not committed; run its script"
    with Image.open(committed) as image:
        assert image.size == size
    assert committed.stat().st_size < 150_000


# -- the revocation timeline -----------------------------------------------------------------

def test_the_revocation_timeline_is_drawn_with_its_notices_revocations_and_stalls(tmp_path):
    timeline = script("revocation_timeline")
    path = timeline.draw(tmp_path / "timeline.png")
    check_drawn_and_committed(path, DOCS / "revocation-timeline.png", (timeline.WIDTH, timeline.HEIGHT))
    rgb = pixels(path)
    assert near(rgb, "tab:blue") > 500  # the three world-size lines
    assert near(rgb, "tab:red") > 500  # three revocations on each of three panels
    assert near(rgb, "tab:orange") > 100  # the notices of run (b)
    assert timeline.draw(tmp_path / "again.png").read_bytes() == path.read_bytes()


def test_the_timeline_reads_the_benchmarks_rows_and_the_trace():
    timeline = script("revocation_timeline")
    assert [round(t, 1) for t in timeline.revocation_times()] == [634.6, 785.7, 857.0]
    runs = timeline.benchmark_runs()
    assert [r["sizes"] for r in runs] == [[4, 3, 2, 1]] * 3
    notices = [r for r in runs if r["label"] == "(b) transientvod, notices"][0]
    assert all(o < 0 for o in notices["offsets_s"])  # the size fell before each host went
    assert notices["lost_steps"] == 0


def test_other_rows_draw_another_timeline(tmp_path):
    timeline = script("revocation_timeline")
    document = json.loads(timeline.RESULTS.read_text())
    timeline.draw(tmp_path / "as-recorded.png", results=timeline.RESULTS)
    document["runs"][-1]["rows"][0][3] = "+60.0, +60.0, +60.0"  # run (a) stalls a minute each time
    edited = tmp_path / "testbed.json"
    edited.write_text(json.dumps(document))
    timeline.draw(tmp_path / "edited.png", results=edited)
    assert not np.array_equal(pixels(tmp_path / "edited.png"), pixels(tmp_path / "as-recorded.png"))


def test_rows_that_do_not_match_the_trace_are_one_sentence(tmp_path):
    timeline = script("revocation_timeline")
    document = json.loads(timeline.RESULTS.read_text())
    document["runs"][-1]["rows"][0][3] = "+31.2, +30.4"
    edited = tmp_path / "testbed.json"
    edited.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"records 2 revocations .* but the trace has 3 revocations\.$"):
        timeline.draw(tmp_path / "timeline.png", results=edited)


# -- codec x staleness x bandwidth -----------------------------------------------------------

def test_the_exchange_chart_is_drawn_with_every_codec(tmp_path):
    chart = script("exchange_chart")
    path = chart.draw(tmp_path / "exchange.png")
    check_drawn_and_committed(path, DOCS / "exchange-chart.png", (chart.WIDTH, chart.HEIGHT))
    rgb = pixels(path)
    for colour in chart.CODEC_COLOURS.values():
        assert near(rgb, colour) > 2000, colour
    assert chart.draw(tmp_path / "again.png").read_bytes() == path.read_bytes()


def test_the_exchange_chart_reads_each_runs_bandwidths():
    chart = script("exchange_chart")
    runs = chart.exchange_runs()
    assert [r["bandwidths"] for r in runs] == [["unshaped", "100mbit/400ms"], ["unshaped", "25mbit/400ms"]]
    assert runs[0]["bars"][("int8", 2)] == [15.4, 11.5]
    assert set(runs[1]["bars"]) == {(c, s) for c in ("none", "fp16", "int8") for s in (0, 2)}


# -- plan's picture --------------------------------------------------------------------------

def documented_plan_command() -> list[str]:
    """The one command docs/planner.md gives for docs/plan.png, as words."""
    lines = [line for line in (DOCS / "planner.md").read_text().splitlines()
             if line.startswith(".venv/bin/transientvod plan ") and line.endswith(" --figure docs/plan.png")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_plans_picture_is_the_documented_commands(tmp_path):
    words = documented_plan_command()
    assert words[:2] == [".venv/bin/transientvod", "plan"]
    path = tmp_path / "plan.png"
    done = subprocess.run(TRANSIENTVOD + words[1:-1] + [str(path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    check_drawn_and_committed(path, DOCS / "plan.png", (900, 550))
    rgb = pixels(path)
    plot = rgb[:, :int(0.8 * rgb.shape[1])]
    # Both ends of the risk scale (viridis) among the points: configurations that meet the
    # deadline and ones that miss it.
    from matplotlib import colormaps
    for risk in (0.0, 1.0):
        colour = "#%02x%02x%02x" % tuple(round(255 * c) for c in colormaps["viridis"](risk)[:3])
        assert near(plot, colour) > 20, risk


# -- compare's cost against accuracy ---------------------------------------------------------

def test_compares_figure_is_drawn_from_a_real_mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    figure = script("compare_figure")
    from transientvod.tracking.compare import load_runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recorded = figure.recorded_runs()
    figure.fill_store(uri, recorded)
    read_back = load_runs(uri, figure.EXPERIMENT)
    assert [(r.run_name, r.cost_usd, round(100 * r.accuracy, 2)) for r in read_back] == \
        [(r["run"], r["cost ($)"], r["top-1 (%)"]) for r in recorded]
    path = figure.draw(tmp_path / "compare.png", uri)
    check_drawn_and_committed(path, DOCS / "compare.png", (figure.WIDTH, figure.HEIGHT))
    rgb = pixels(path)
    for colour in ("C0", "C1", "C2"):  # one marker colour per configuration
        assert near(rgb, colour) > 30, colour
    # What the script draws for the page (its own fresh store) is this picture.
    assert figure.draw(tmp_path / "page.png").read_bytes() == path.read_bytes()


def test_another_store_draws_another_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    figure = script("compare_figure")
    recorded = figure.recorded_runs()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    figure.fill_store(uri, [{**recorded[0], "cost ($)": 0.03, "top-1 (%)": 97.0}, *recorded[1:]])
    edited = pixels(figure.draw(tmp_path / "edited.png", uri))
    assert not np.array_equal(edited, pixels(figure.draw(tmp_path / "as-recorded.png")))
