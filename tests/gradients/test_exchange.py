"""The gradient exchange across real ranks (`horovodrun`, Gloo), and its input checks.

Each world size runs the probe once (tests/probes/exchange_probe.py, every check it needs) and the
tests read their rows from it, so a dozen properties cost three horovodrun starts.
"""
from __future__ import annotations

import functools
import re

import pytest
import torch

from conftest import explain, run_probe
from transientvod.gradients.codecs import ShardLayout, payload_bytes
from transientvod.gradients.exchange import GradientExchange

CODECS = ("none", "fp16", "bf16", "int8")
# Worst-case error of the average, as a multiple of the largest gradient magnitude: each
# sender's rounding (half an ulp or half a scale) and the owner's rounding of the average.
BOUNDS = {"none": 1e-6, "fp16": 2.0 ** -10, "bf16": 2.0 ** -8, "int8": 2.0 / 127}
# Written out here, not read from transientvod.gradients.codecs.payload_bytes: the byte tests check the
# product against the protocol, so the expected figures must not come from the product.
PAYLOAD_BYTES = {"fp16": 2, "bf16": 2, "int8": 1}
CHECKS_BY_WORLD = {
    2: ("bitident", "average", "stale", "stale_from", "nan", "buckets", "switch", "drain", "lost_peer", "bytes",
        "backward_polls", "backward_starts", "waited", "tuning"),
    3: ("bitident_one_tensor", "average", "bytes"),
    4: ("owner_residual", "recut_residual", "recut_delivery", "bytes"),
}


@functools.lru_cache(maxsize=None)
def probe(world: int) -> tuple:
    return tuple(run_probe("exchange_probe.py", world, *CHECKS_BY_WORLD[world]))


def rows(world: int, check: str) -> list[dict]:
    found = [row for row in probe(world) if row["check"] == check]
    assert {row["rank"] for row in found} == set(range(world)), f"{check}: not every rank reported"
    return found


# -- bad input: one sentence naming the key (no Horovod needed) ------------------------------------


def _exchange(**options) -> GradientExchange:
    param = torch.nn.Parameter(torch.zeros(8))
    return GradientExchange(torch.optim.SGD([param], lr=1.0), [param], **options)


@pytest.mark.parametrize("options, key", [({"codec": "int4"}, "exchange.codec"),
                                          ({"codec": "int8", "block": 100}, "exchange.block"),
                                          ({"codec": "int8", "block": 2048}, "exchange.block"),
                                          ({"staleness": -1}, "exchange.staleness"),
                                          ({"bucket_elements": 0}, "exchange.bucket_elements")])
def test_bad_exchange_input_is_one_sentence_naming_the_key(options, key):
    with pytest.raises(ValueError) as raised:
        _exchange(**options)
    message = str(raised.value)
    assert message.startswith(key + " is ") and message.count(". ") == 0 and message.endswith("."), message


def test_payload_bytes_are_each_codecs_element_width_and_an_unknown_codec_is_named():
    assert {codec: payload_bytes(codec) for codec in CODECS} == {"none": 4, **PAYLOAD_BYTES}
    with pytest.raises(ValueError, match=r"^exchange.codec is 'int4'; it must be one of"):
        payload_bytes("int4")


def test_block_is_not_checked_for_codecs_without_blocks():
    assert _exchange(codec="fp16", block=100).block == 100


@pytest.mark.parametrize("numel, world, block, scaled", [(70_000, 4, 512, True), (1, 3, 256, True),
                                                         (4, 2, 512, True), (1025, 3, 1, False),
                                                         (257 * 7 + 3, 7, 257, True)])
def test_shards_cover_the_bucket_end_to_end_in_whole_blocks(numel, world, block, scaled):
    layout = ShardLayout.of(numel, world, block, scaled)
    assert sum(layout.elements) == numel
    assert layout.start == [sum(layout.elements[:r]) for r in range(world)]
    if scaled:
        assert all(start % block == 0 for start, n in zip(layout.start, layout.elements) if n)
        assert layout.scales == [-(-n // block) for n in layout.elements]
    else:
        assert layout.scales == [0] * world
        assert max(layout.elements) - min(layout.elements) <= 1


# -- real ranks ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("world, check", [(2, "bitident"), (3, "bitident_one_tensor")])
def test_synchronous_exchange_is_bit_identical_to_distributed_optimizer(world, check):
    """At N = 2 a small MLP. At N = 3 one weight matrix: the average's scaling must be
    Horovod's (1/3 rounded to fp32 first). Several tensors at N = 3 are not bit-identical:
    Gloo's sum order per element follows its position in Horovod's fusion buffer, which
    DistributedOptimizer fills in the order its hooks fire, and the bucket in parameter order."""
    found = rows(world, check)
    for row in found:
        assert row["exchange"] == row["distributed_optimizer"], row
    assert len({row["exchange"] for row in found}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_each_codec_averages_within_its_error_bound(world):
    found = rows(world, "average")
    assert {r["codec"] for r in found} == set(BOUNDS)
    for row in found:
        bound = BOUNDS[row["codec"]] * row["max_abs_grad"] * (world + 1)
        assert row["max_error"] <= bound, row


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
def test_a_small_steady_gradient_arrives_in_full_through_the_owners_residual(codec):
    """On 4 ranks, 200 steps: within 10 %, steady (rounding never averages out) and noisy.
    main's exchange (no owner residual) delivered fp16 steady_b 0.24, int8 steady_a 0.04 and
    int8 noisy_b 0.55 of it in this same check."""
    for row in rows(4, "owner_residual"):
        if row["codec"] != codec:
            continue
        assert row["applied"] == row["steps"] == 200, row
        for part in ("steady_a", "steady_b", "noisy_a", "noisy_b"):
            assert row[part] == pytest.approx(1.0, abs=0.10), (part, row)


@pytest.mark.slow
@pytest.mark.parametrize("codec", ("fp16", "bf16", "int8"))
def test_the_residuals_follow_their_elements_when_the_buckets_are_cut_afresh(codec):
    """The same 200 steps on 4 ranks as above, the four parts now four parameters, drained and
    re-cut every 20 steps (one bucket each, then one for all, in turns): still within 10 %."""
    for row in rows(4, "recut_residual"):
        if row["codec"] != codec:
            continue
        assert row["applied"] == row["steps"] == 200 and row["recut_every"] == 20, row
        assert row["buckets"] == 1, row  # the last cut, at step 180, was one bucket for all
        for part in ("steady_a", "steady_b", "noisy_a", "noisy_b"):
            assert row[part] == pytest.approx(1.0, abs=0.10), (part, row)


@pytest.mark.slow
@pytest.mark.parametrize("codec", ("fp16", "bf16", "int8"))
def test_what_the_residuals_held_at_a_cut_is_delivered_after_it(codec):
    """On 4 ranks: one step whose rounding leaves residuals at senders and owners, a cut from 2
    buckets to one, 3 steps of zero gradient: the parameters end at the ranks' mean gradient
    within a thousandth of the codec's quantum (dropped residuals: an eighth to a half of one)."""
    for row in rows(4, "recut_delivery"):
        if row["codec"] == codec:
            assert row["buckets"] == [2, 1], row
            assert row["error"] <= row["quantum"] / 1000, row


@pytest.mark.slow
@pytest.mark.parametrize("slow_cut", [1, 3])
def test_bucket_tuning_keeps_the_faster_cut_on_every_rank_and_applies_each_step_once(slow_cut):
    """bucket_tuning.py at staleness 2: 3 steps, then turns A B B A of 14 steps (4 skipped, 10
    timed), A the default (one bucket while stale) and B the other (3), then the faster cut."""
    found = [row for row in rows(2, "tuning") if row["slow_cut"] == slow_cut and not row["bursty"]]
    assert len(found) == 2, found
    kept = 3 if slow_cut == 1 else 1
    for row in found:
        assert row["turn_steps"] == 14, row
        assert row["ran_in"] == [1] * 3 + [1] * 14 + [3] * 28 + [1] * 14 + [kept] * 5, row
        assert row["chosen_buckets"] == kept and row["chosen"] == row["sizes"][0 if kept == 1 else 1], row
        assert row["applied"] == 64 and row["param_range"] == [-64.0, -64.0], row
    slow = 0 if slow_cut == 1 else 1  # where the slow cut is in `sizes` (A is one bucket)
    rank0 = next(row for row in found if row["rank"] == 0)
    assert rank0["seconds"][slow] > rank0["seconds"][1 - slow] + 0.03, rank0  # it slept 60 ms a step there


@pytest.mark.slow
def test_bucket_tuning_compares_mean_step_times_without_the_steps_that_did_other_work():
    """The slow cut (3 buckets) sleeps 400 ms every 4th step, the fast one 50 ms every step plus
    500 ms of "other work" after every 7th: by the median, or with that work counted, the slow
    cut would look faster. One bucket is kept, on both ranks."""
    found = [row for row in rows(2, "tuning") if row["bursty"]]
    assert len(found) == 2, found
    for row in found:
        assert row["ran_in"] == [1] * 3 + [1] * 14 + [3] * 28 + [1] * 14 + [1] * 5, row
        assert row["chosen_buckets"] == 1 and row["applied"] == 64, row
    rank0 = next(row for row in found if row["rank"] == 0)
    one, three = rank0["seconds"]  # A (one bucket) first
    assert one >= 0.05 and three > one + 0.02, rank0  # means: 50 ms of sleep a step against 100


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_waited_seconds_count_the_time_a_rank_waits_for_a_late_peer(codec):
    """benchmarks/exchange.py reports waited_seconds as the communication compute did not hide."""
    found = {row["rank"]: row for row in rows(2, "waited") if row["codec"] == codec}
    # Per step, from the second (the first also waits for Horovod's first negotiation of a name).
    early, late = sum(found[0]["waited"][1:]), sum(found[1]["waited"][1:])
    steps, lag = len(found[0]["waited"]) - 1, found[0]["late"]
    # Rank 0 cannot finish a step before rank 1 has started it, `lag` seconds after rank 0 did.
    assert early >= 0.8 * steps * lag, found
    assert late < early / 4, found  # rank 1 finds its peer's data there


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_staleness_applies_the_gradient_of_s_steps_ago_and_drain_applies_the_rest(codec):
    found = [row for row in rows(2, "stale") if row["codec"] == codec]
    assert {(row["staleness"], row["size"]) for row in found} == {(s, n) for s in (0, 1, 2) for n in (4, 1024)}
    for row in found:
        s = row["staleness"]
        assert row["applied"] == [False] * s + [True] * (6 - s), row
        # after step t, the gradients of steps 0 .. t - s (values 1 .. t - s + 1) are applied
        expected = [-sum(range(1, t - s + 2)) for t in range(6)]
        assert row["params"] == pytest.approx(expected, rel=1e-5), row
        assert row["drained"] == s
        assert row["final"] == pytest.approx([-21.0] * 4, rel=1e-5), row


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_steps_before_stale_from_step_are_synchronous_then_each_is_applied_s_steps_later(codec):
    """The synchronous warm-up (exchange.sync_warmup): staleness 2 from step 3 of 8."""
    for row in [row for row in rows(2, "stale_from") if row["codec"] == codec]:
        # steps 0-2 applied at once; steps 3 and 4 refill the pipeline; from step 5 on, step t - 2
        assert row["applied"] == [True, True, True, False, False, True, True, True], row
        applied_through = [0, 1, 2, 2, 2, 3, 4, 5]  # the last step whose gradient is applied after step t
        expected = [-sum(range(1, last + 2)) for last in applied_through]
        assert row["params"] == pytest.approx(expected, rel=1e-5), row
        assert row["drained"] == 2
        assert row["final"] == pytest.approx([-36.0] * 4, rel=1e-5), row  # every gradient exactly once


@pytest.mark.slow
def test_buckets_start_during_backward_and_train_the_same_parameters():
    """Started from the gradient hooks, every bucket of every step after the ring's first goes
    out while backward runs, and the parameters are those of starting all in step()."""
    found = rows(2, "backward_starts")
    assert {(row["codec"], row["staleness"]) for row in found} == {(c, s) for c in CODECS for s in (0, 2)}
    for row in found:
        early, in_step = row["early"], row["in_step"]
        assert early["buckets"] == 4, row  # one per layer at 500 elements
        assert early["checksum"] == in_step["checksum"], row
        assert in_step["started_in_backward"] == 0, row
        # Every bucket of steps 1 to 11 and of the refused 13th; step 0, the ring's first,
        # started in step() (its number was not known before).
        assert early["started_in_backward"] == 12 * 4, row
        assert early["refused"].startswith("gradient exchange: zero_grad() after backward without step(12)"), row
        assert early["refused"].count(". ") == 0 and early["refused"].endswith("."), row


def test_a_second_backward_before_step_is_one_sentence():
    model = torch.nn.Linear(4, 2)
    exchange = GradientExchange(torch.optim.SGD(model.parameters(), lr=1.0), model.parameters())
    exchange.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(RuntimeError) as raised:
        model(torch.ones(1, 4)).sum().backward()
    message = str(raised.value)
    assert "second backward() before step()" in message and "start_in_backward=False" in message, message
    assert message.count(". ") == 0 and message.endswith("."), message
    # Without early starts, gradients may be accumulated over several backward passes.
    model = torch.nn.Linear(4, 2)
    exchange = GradientExchange(torch.optim.SGD(model.parameters(), lr=1.0), model.parameters(),
                                start_in_backward=False)
    exchange.zero_grad()
    for _ in range(2):
        model(torch.ones(1, 4)).sum().backward()
    assert model.weight.grad.eq(2.0).all()


def test_the_config_defaults_are_the_exchange_defaults():
    import inspect

    from transientvod.config.schema import ExchangeConfig
    from transientvod.gradients.exchange import MIN_COMPRESS_ELEMENTS
    defaults = inspect.signature(GradientExchange).parameters
    assert ExchangeConfig().min_compress_elements == MIN_COMPRESS_ELEMENTS == defaults["min_compress_elements"].default
    assert ExchangeConfig().bucket_elements is None and defaults["bucket_elements"].default is None


def test_the_default_buckets_follow_the_staleness():
    """Unset, bucket_elements cuts the gradient in BACKWARD_BUCKETS buckets at staleness 0
    (they start during backward), none under BUCKET_ELEMENTS, and in one bucket when stale,
    where s steps hide the exchange and every bucket costs CPU. A given size wins."""
    from transientvod.gradients.staleness import BACKWARD_BUCKETS, BUCKET_ELEMENTS

    def cut(sizes, staleness, **options):
        params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
        exchange = GradientExchange(torch.optim.SGD(params, lr=1.0), params, staleness=staleness, **options)
        return [sum(p.numel() for p in bucket.params) for bucket in exchange.buckets]

    large = [1_000_000] * 6  # a third is 2M elements, far above BUCKET_ELEMENTS
    assert BACKWARD_BUCKETS == 3 and cut(large, 0) == [2_000_000] * 3
    assert cut(large, 1) == cut(large, 2) == [6_000_000]
    small = [40_000] * 6  # a third is 80K, under BUCKET_ELEMENTS: buckets of at least that
    assert cut(small, 0) == [160_000, 80_000] and cut(small, 2) == [240_000]
    assert cut(large, 2, bucket_elements=BUCKET_ELEMENTS) == [1_000_000] * 6


def test_bucket_tuning_tries_the_default_cut_then_the_other_unless_they_cut_alike():
    from transientvod.gradients.bucket_tuning import cuts

    def params(*sizes):
        return [torch.nn.Parameter(torch.zeros(n)) for n in sizes]

    assert cuts(params(*[1_000_000] * 6), 0) == [2_000_000, 6_000_000]  # 3 buckets first at staleness 0, then one
    assert cuts(params(*[1_000_000] * 6), 2) == [6_000_000, 2_000_000]  # one first while stale, then 3
    assert cuts(params(40_000, 40_000), 0) == [131_072]  # under BUCKET_ELEMENTS: one bucket either way
    assert cuts(params(100_000, 40_000), 0) == [131_072]  # the remainder joins the first: still one
    assert cuts(params(100_000, 100_000), 2) == [200_000]  # 131,072 closes at both: one bucket too
    assert cuts(params(150_000, 150_000), 2) == [300_000, 131_072]  # one bucket, or two


def test_rebucket_refuses_while_steps_are_in_flight_and_keeps_a_cut_already_in_use():
    params = [torch.nn.Parameter(torch.zeros(1000)) for _ in range(4)]
    exchange = GradientExchange(torch.optim.SGD(params, lr=1.0), params, staleness=1, bucket_elements=1000)
    assert len(exchange.buckets) == 4 and exchange.rebucket(1000) is False
    exchange._starting = object()  # what backward leaves between its first bucket and step()
    with pytest.raises(RuntimeError, match=r"rebucket\(\) with steps in flight; drain\(\) first"):
        exchange.rebucket(4000)
    exchange._starting = None
    assert exchange.rebucket(4000) is True and len(exchange.buckets) == 1
    new_buffer = exchange.buckets[0].grad.untyped_storage().data_ptr()
    assert all(p.grad.untyped_storage().data_ptr() == new_buffer for p in params)  # views of the new buffer


def test_a_discarded_exchange_frees_its_codecs_while_the_model_lives():
    """The gradient hooks stay on the model's parameters; they must not hold the exchange, nor
    its buckets' codecs (a residual as big as the gradient)."""
    import gc
    import weakref

    class Codec:  # stands in for a codec and its residual
        pass

    model = torch.nn.Linear(4, 2)
    exchange = GradientExchange(torch.optim.SGD(model.parameters(), lr=1.0), model.parameters())
    codec = Codec()
    exchange.buckets[0].codecs["fp16"] = codec
    exchange_ref, codec_ref = weakref.ref(exchange), weakref.ref(codec)
    del exchange, codec
    gc.collect()
    assert exchange_ref() is None and codec_ref() is None
    model(torch.ones(1, 4)).sum().backward()  # the hooks find no exchange and do nothing


def test_buckets_are_cut_in_backward_order():
    """The last parameters first; a bucket closes at bucket_elements; a remainder under half of
    it joins the bucket before it."""
    sizes = [500, 3000, 100, 5000, 800]
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    cut = lambda elements: [[p.numel() for p in b.params] for b in GradientExchange(  # noqa: E731
        torch.optim.SGD(params, lr=1.0), params, bucket_elements=elements).buckets]
    assert cut(4000) == [[800, 5000], [100, 3000, 500]]
    assert cut(1000) == [[800, 5000], [100, 3000], [500]]
    assert cut(10_000) == [[800, 5000, 100, 3000, 500]]
    assert cut(3000) == [[800, 5000], [100, 3000, 500]]  # 500 left, under 1,500: joins


@pytest.mark.slow
def test_backward_moves_a_step_in_flight_on_to_its_next_phase():
    """Between two step() calls only backward runs: its gradient hooks must start the owner's
    phase once the shards have arrived, not leave it for the next step()."""
    found = rows(2, "backward_polls")
    assert {row["codec"] for row in found} == {"fp16", "bf16", "int8"}
    for row in found:
        assert row["phases_done"] >= 1, row


@pytest.mark.slow
def test_a_nan_on_one_rank_skips_the_step_on_every_rank():
    found = rows(2, "nan")
    for codec in CODECS:
        mine = [row for row in found if row["codec"] == codec]
        for row in mine:
            # staleness 1: step 3 is finished by step 4's call
            assert row["applied"] == [False, True, True, True, False, True], row
            assert row["skipped"] == 1 and row["finite"], row
            assert row["param"] == pytest.approx(-5.0, rel=1e-5), row
        assert len({row["checksum"] for row in mine}) == 1, mine


@pytest.mark.slow
def test_several_buckets_each_with_its_own_codec():
    for row in rows(2, "buckets"):
        # Buckets in backward order: the 5,000-element parameter first (compressed), then the
        # 100 and 3,000 under the 4,000-element floor (fp32).
        expected_first = ["none"] if row["codec"] == "none" else [row["codec"]]
        assert row["buckets"] == [expected_first, ["none"]], row
        bound = BOUNDS[row["codec"]] * 3 * 3  # the largest gradient is 2 * 3; three steps
        assert max(row["errors"]) <= bound, row
        # staleness 1: step(0) applies nothing, step(1) and step(2) one step each, drain() the
        # last; each applied step reads its two buckets' flags on the host once, not per bucket
        assert row["reads"] == [0, 1, 1, 1], row


@pytest.mark.slow
def test_compression_starts_at_compress_from_step():
    for row in rows(2, "switch"):
        assert row["codecs"] == ["int8", "none"]
        fp32, int8 = row["sent"][:3], row["sent"][3:]
        assert fp32 == [70_000 * 4] * 3, row  # 2 (N - 1) / N of 4-byte elements at N = 2
        assert len(set(int8)) == 1 and int8[0] < fp32[0] / 3.5, row
        assert row["param"] == pytest.approx(-6.0, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_every_gradient_started_is_applied_exactly_once_through_a_graceful_reset_and_the_end(codec):
    for row in rows(2, "drain"):
        if row["codec"] != codec:
            continue
        counts = [round(c, 3) for c in row["counts"]]
        assert counts == [1.0] * 8 + [0.0] * 2, row
        assert row["drained"] == [2, 2] and row["applied"] == 8, row


@pytest.mark.slow
def test_a_lost_peer_reset_clears_every_residual_owners_included():
    for row in rows(2, "lost_peer"):
        assert all(r > 0 for r in row["residuals_before"]), row  # there was something to clear
        assert row["residuals_after"] == [0.0, 0.0] and row["queue_after"] == 0, row


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_bytes_per_element_per_worker_are_constant_in_n(world):
    """From the tensors and splits each rank hands Horovod: on average over the ranks exactly
    2 (N - 1) / N · b · n for fp16 and bf16 (the payload alone, codecs/framing.py), and for int8
    2 (N - 1) / N · (n + 4 · (scales + N flags)) plus at most 3 bytes of padding in each of the
    2 (N - 1) segments a rank sends (codecs/packing.py); no rank above 2 (N - 1) / N · b + 2 %."""
    found = rows(world, "bytes")
    for codec in ("fp16", "bf16", "int8"):
        mine = [row for row in found if row["codec"] == codec]
        n, block, b = mine[0]["elements"], mine[0]["block"], PAYLOAD_BYTES[codec]
        framed = codec == "int8"
        scales, flags = (-(-n // block), world) if framed else (0, 0)
        padding = 3 * 2 * (world - 1) if framed else 0
        mean = sum(row["sent"] for row in mine) / world
        formula = 2 * (world - 1) / world * (b * n + 4 * (scales + flags))
        assert formula - 1e-6 <= mean <= formula + padding + 1e-6, mine
        for row in mine:
            assert row["sent"] / n <= 2 * (world - 1) / world * b * 1.02 + 4 * 2 * (scales + flags) / n, row
    fp32 = [row["sent"] for row in found if row["codec"] == "none"]
    assert fp32 == [2 * (world - 1) * 70_000 * 4 // world] * world


@pytest.mark.slow
def test_a_stale_job_warms_up_synchronously_then_lowers_its_momentum(job):
    """exchange.sync_warmup and stale_momentum through the training loop (staleness.StalenessRule)."""
    j = job("stale-momentum", exchange={"staleness": 2, "codec": "fp16", "compress_after": 0.0},
            optimizer={"warmup_steps": 20, "momentum": 0.9}, train={"steps": 60})
    done = j.run(j.discovery("0=localhost:1,127.0.0.1:1"), timeout=180)
    assert done.returncode == 0, explain(done)
    momentum = {row["step"]: row["momentum"] for row in j.rows("metrics.jsonl") if "momentum" in row}
    # a row at step k was logged after the step k - 1 was taken; steps 0-19 are synchronous
    assert momentum[10] == momentum[20] == 0.9, momentum
    assert momentum[30] == momentum[60] == pytest.approx(0.9 - 2 / 3), momentum
    assert "drained 2 step(s) of gradients in flight" in done.stderr  # stale at the end
    assert "gradient exchange: codec fp16, staleness 2, 1 bucket(s) of " in done.stderr  # stale: one bucket
    assert j.summary()["steps"] == 60


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_host_removed_while_stale_exchanges_are_in_flight(job, codec):
    """A graceful removal (at a commit, the old ring whole) drains the steps in flight."""
    j = job(f"stale-{codec}", exchange={"staleness": 2, "codec": codec, "min_compress_elements": 0,
                                       "compress_after": 0.0}, train={"steps": 400})
    done = j.run(j.discovery("0=localhost:1,127.0.0.1:1", "100=localhost:1"), timeout=240)
    assert done.returncode == 0, explain(done)
    summary = j.summary()
    assert summary["steps"] == 400
    assert summary["world_sizes_seen"] == [2, 1]
    assert "drained 2 step(s) of gradients in flight" in done.stderr
    assert "dropped" not in done.stderr
    assert summary["test_accuracy"] > 0.5  # it still learned


@pytest.mark.slow
def test_each_ring_tunes_its_buckets_again_from_the_default_cut(job):
    """Through train.py: a model of 297,450 parameters (2 buckets at staleness 0, or one), fp16,
    2 ranks; a host leaves at step 80. The first ring times both cuts from step 3, the ring of
    one that follows starts again from the default cut and times both again."""
    j = job("tuned", model={"depth": 8, "width": 32}, exchange={"codec": "fp16", "compress_after": 0.0},
            train={"steps": 200})
    done = j.run(j.discovery("0=localhost:1,127.0.0.1:1", "80=localhost:1"), timeout=240)
    assert done.returncode == 0, explain(done)
    assert j.summary()["steps"] == 200 and j.summary()["world_sizes_seen"] == [2, 1], explain(done)
    assert "each ring times the other cut too and keeps the faster" in done.stderr
    tunings = re.findall(r"bucket tuning on a ring of (\d): (\d) bucket\(s\) [\d.]+ ms, (\d) bucket\(s\) [\d.]+ ms "
                         r"a step; keeping (\d) bucket\(s\)", done.stderr)
    assert [t[0] for t in tunings] == ["2", "1"], explain(done)
    for _, default, other, kept in tunings:
        assert (default, other) == ("2", "1") and kept in (default, other), tunings
