"""benchmarks/goodput.py's arithmetic: which steps a job kept, at which world size, and what an
oracle would have needed for them. The benchmark itself runs jobs on a testbed (root, half an
hour); these are the rows it reads, as rank 0 writes them (every log_every steps)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import REPO

BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def goodput():
    sys.path.insert(0, str(BENCHMARKS))  # it imports its neighbours (testbed.py)
    try:
        spec = importlib.util.spec_from_file_location("benchmark_goodput", BENCHMARKS / "goodput.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def rows(*pairs):
    return [{"step": step, "world_size": size, "time": float(i)} for i, (step, size) in enumerate(pairs)]


def test_a_job_without_changes_is_one_stretch_per_row_at_its_size(goodput):
    assert goodput.kept_sizes(rows((10, 4), (20, 4))) == [(1, 10, 4), (11, 20, 4)]
    assert goodput.oracle_seconds(rows((10, 4), (20, 4)), {4: 10.0}) == pytest.approx(2.0)


def test_a_shrink_counts_the_later_steps_at_the_smaller_size(goodput):
    kept = goodput.kept_sizes(rows((10, 4), (20, 4), (30, 3), (40, 2)))
    assert kept == [(1, 10, 4), (11, 20, 4), (21, 30, 3), (31, 40, 2)]
    assert goodput.oracle_seconds(rows((10, 4), (20, 4), (30, 3), (40, 2)), {4: 10.0, 3: 5.0, 2: 2.0}) == \
        pytest.approx(1 + 1 + 2 + 5)


def test_steps_lost_to_a_roll_back_are_not_the_oracles_and_their_redo_is_at_the_new_size(goodput):
    # Trained to 40 at 4 workers, rolled back to the commit at 20, trained again at 3.
    job = rows((10, 4), (20, 4), (30, 4), (40, 4), (30, 3), (40, 3), (50, 3))
    assert goodput.kept_sizes(job) == [(1, 10, 4), (11, 20, 4), (21, 30, 3), (31, 40, 3), (41, 50, 3)]
    assert goodput.oracle_seconds(job, {4: 10.0, 3: 5.0}) == pytest.approx(1 + 1 + 2 + 2 + 2)


def test_the_evaluations_row_is_not_a_step(goodput):
    job = rows((10, 2), (20, 2)) + [{"step": 20, "test_accuracy": 0.9}]
    assert goodput.kept_sizes(job) == [(1, 10, 2), (11, 20, 2)]
