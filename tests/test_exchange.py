"""The gradient exchange across real ranks (`horovodrun`, Gloo): exactness and error bounds."""
from __future__ import annotations


import pytest

from conftest import explain, run_probe

pytestmark = pytest.mark.slow
# Worst-case error of the average, as a multiple of the largest gradient magnitude: each rank's
# rounding (half an ulp), plus the rounding of the sum on the wire (fp16 sums in fp16).
BOUNDS = {"none": 1e-6, "fp16": 2.0 ** -10, "bf16": 2.0 ** -8, "int8": 2.0 / 127}


def test_synchronous_exchange_is_bit_identical_to_distributed_optimizer():
    rows = run_probe("exchange_probe.py", 2, "bitident")
    assert len(rows) == 2
    for row in rows:
        assert row["exchange"] == row["distributed_optimizer"], row
    assert rows[0]["exchange"] == rows[1]["exchange"]


@pytest.mark.parametrize("world", [2, 3])
def test_each_codec_averages_within_its_error_bound(world):
    rows = run_probe("exchange_probe.py", world, "average")
    assert {r["codec"] for r in rows} == set(BOUNDS)
    for row in rows:
        assert row["world"] == world
        bound = BOUNDS[row["codec"]] * row["max_abs_grad"] * (world + 1)
        assert row["max_error"] <= bound, row


def test_staleness_applies_the_gradient_of_s_steps_ago():
    rows = run_probe("exchange_probe.py", 2, "stale")
    for row in rows:
        s = row["staleness"]
        assert row["applied"] == [False] * s + [True] * (6 - s)
        # steps 0 .. 5 - s were applied: gradients 1 .. 6 - s
        assert row["param"] == pytest.approx(-sum(range(1, 7 - s)))


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_host_removed_while_stale_exchanges_are_in_flight(job, codec):
    j = job(f"stale-{codec}", exchange={"staleness": 2, "codec": codec, "min_compress_elements": 0,
                                       "compress_after": 0.0}, train={"steps": 400})
    done = j.run(j.discovery("0=localhost:1,127.0.0.1:1", "100=localhost:1"), timeout=240)
    assert done.returncode == 0, explain(done)
    summary = j.summary()
    assert summary["steps"] == 400
    assert summary["world_sizes_seen"] == [2, 1]
    assert "dropped 2 step(s) of gradients in flight" in done.stderr
    assert summary["test_accuracy"] > 0.5  # it still learned
