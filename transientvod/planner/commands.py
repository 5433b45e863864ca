"""`transientvod simulate` and `transientvod plan`: tables and CSV from scenario.py.

    transientvod simulate --workers 2,4,8 --market spot,on-demand --system study,elastic
    transientvod plan --budget 2.00 --max-workers 8
    transientvod plan --deadline 1.5 --gpus k80,v100 --speed v100=14.2
"""
from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

from transientvod.planner.rate_band import parse_band
from transientvod.planner.scenario import Cluster, Outcome, Simulator, Workload
from transientvod.planner.rentals import server_type
from transientvod.planner.study_data import PlanError

# "time h" and "cost $" are the cloud's: wall time and bill from renting the servers, their
# provisioning included. "train h" and "study $" are the study's measure: training time, and
# training server-seconds x prices; its tables are that, so compare them with these two.
COLUMNS = (("configuration", "configuration", "s"), ("fail %", "failure_pct", ".1f"),
           ("revocations", "revocations_mean", ".2f"), ("time h", "time_h_mean", ".3f"),
           ("p50", "time_h_p50", ".3f"), ("p90", "time_h_p90", ".3f"), ("cost $", "cost_usd_mean", ".3f"),
           ("p50", "cost_usd_p50", ".3f"), ("p90", "cost_usd_p90", ".3f"),
           ("train h", "training_h_mean", ".3f"), ("study $", "study_cost_usd_mean", ".3f"))
MEASURES = ("time h and cost $: the cloud's wall time and bill, provisioning included; train h and study $: "
            "the study's measure, training time and training server-seconds x prices")


def parse_list(text: str, what: str, cast=str) -> list:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise PlanError(f"{what} is empty; give one or more values separated by commas.")
    try:
        return [cast(item) for item in items]
    except ValueError:
        raise PlanError(f"{what} {text!r} must be {cast.__name__} values separated by commas.") from None


def parse_speeds(items: list[str]) -> dict[str, float]:
    speeds = {}
    for item in items:
        gpu, _, value = item.partition("=")
        gpu = server_type(gpu)  # an unknown type is its own sentence
        try:
            speeds[gpu] = float(value)
        except ValueError:
            raise PlanError(f"--speed {item!r} must look like v100=14.2 (steps per second of one server).") from None
    return speeds


def parse_mix(text: str) -> tuple:
    """'k80:2,p100:2' -> (("k80", 2), ("p100", 2)): one mixed cluster."""
    mix = []
    for item in text.split(","):
        gpu, _, count = item.strip().partition(":")
        try:
            count = int(count)
        except ValueError:
            raise PlanError(f"--workers entry {item.strip()!r} must look like p100:2 (GPU type:servers).") from None
        if count < 1:
            raise PlanError(f"--workers entry {item.strip()!r} has {count} servers; give 1 or more of each type.")
        mix.append((server_type(gpu), count))
    return tuple(mix)


def parse_schedule(text: str | None) -> tuple:
    """'16000:+1,32000:+1' -> ((16000, 1), (32000, 1)): servers added at steps."""
    if not text:
        return ()
    schedule = []
    for item in text.split(","):
        step, _, count = item.strip().partition(":")
        try:
            step, count = int(step), int(count)
        except ValueError:
            raise PlanError(f"--schedule entry {item.strip()!r} must look like 16000:+1 (at step 16000, add 1 "
                            "server).") from None
        if step <= 0 or count <= 0 or not count_is_signed(item):
            raise PlanError(f"--schedule entry {item.strip()!r} must add 1 or more servers (+N) at a step above 0; "
                            "a schedule only adds servers.")
        schedule.append((step, count))
    return tuple(schedule)


def count_is_signed(item: str) -> bool:
    """'16000:+1' says it adds; '16000:1' could mean 'become 1', so it is refused."""
    return item.partition(":")[2].strip().startswith("+")


def speeds_from_runs(items: list[str], default_gpu: str, tracking_uri: str | None) -> dict:
    """--speed-from-run [GPU=]RUN: the speed of every world size from a logged run (run_speed.py),
    RUN a run directory (runs/NAME) or an MLflow run id in --tracking-uri's store; without GPU=
    it calibrates the first GPU type asked for."""
    if not items:
        return {}
    from transientvod.planner.run_speed import measured_model, run_in_directory, speeds_by_size
    from transientvod.planner.speed import calibrate_k80
    from transientvod.tracking.store import store_uri

    k80 = calibrate_k80()
    shape = k80.steps_per_second / k80.steps_per_second[1]
    models = {}
    for item in items:
        gpu, sep, run = item.partition("=")
        gpu, run = (server_type(gpu), run.strip()) if sep else (default_gpu, gpu.strip())
        if "/" in run or Path(run).is_dir():  # a run directory; a run id is 32 hex digits
            uri, run_id = run_in_directory(run)
        else:
            uri, run_id = store_uri(tracking_uri or ""), run
        measured, source = speeds_by_size(uri, run_id)
        models[gpu] = measured_model(gpu, measured, shape, source)
        print(models[gpu].source)
    return models


def workload_from(args, default_gpu: str) -> Workload:
    return Workload(steps=args.steps, single_worker_steps_per_s=parse_speeds(args.speed),
                    speed_models=speeds_from_runs(args.speed_from_run, default_gpu, args.tracking_uri),
                    commit_every=args.commit_every, checkpoint_every=args.checkpoint_every)


def rentals_from(args, types) -> dict:
    """Today's rented types among `types`, priced (rentals.py); the prices, their sources and
    any warning of their age printed first."""
    from transientvod.planner.rentals import rent
    from transientvod.planner.study_data import GPU_TYPES

    rented = sorted({t for t in types if t not in GPU_TYPES})
    if not rented:
        return {}
    table = None
    if args.prices:
        from transientvod.billing.prices import PriceError, load_price_table

        try:
            table = load_price_table(args.prices)
        except PriceError as e:
            raise PlanError(str(e)) from None
    if not args.price_days > 0:
        raise PlanError(f"--price-days is {args.price_days}; give a positive number of days of spot price history.")
    # The CLI logs at INFO; botocore's "Found credentials in ..." would sit among the prices.
    logging.getLogger("botocore.credentials").setLevel(logging.WARNING)
    rentals, notes = rent(rented, args.region, args.endpoint_url, days=args.price_days, on_demand_prices=table)
    for line in notes:
        print(line)
    return rentals


def format_rows(rows: list[dict], columns=COLUMNS) -> str:
    cells = [[name for name, _, _ in columns]]
    for row in rows:
        cells.append(["-" if isinstance(row[key], float) and math.isnan(row[key]) else format(row[key], fmt)
                      for _, key, fmt in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    except OSError as e:
        raise PlanError(f"cannot write {path} ({e.strerror}); choose another --csv path.") from None
    return path


def run_simulate(args) -> int:
    # --workers 2,4,8: sizes of one type each (--gpu); --workers k80:2,p100:2: one mixed cluster.
    if ":" in args.workers and len(parse_mix(args.workers)) > 1:
        shapes = [{"mix": parse_mix(args.workers)}]
        first_gpu = shapes[0]["mix"][0][0]
    elif ":" in args.workers:  # k80:4 is one type: the plain cluster, traces and schedules allowed
        (gpu, workers), = parse_mix(args.workers)
        shapes, first_gpu = [{"gpu": gpu, "workers": workers}], gpu
    else:
        shapes = [{"gpu": gpu, "workers": workers} for gpu in parse_list(args.gpu, "--gpu")
                  for workers in parse_list(args.workers, "--workers", int)]
        first_gpu = server_type(shapes[0]["gpu"])
    workload = workload_from(args, first_gpu)
    clusters = [Cluster(**shape, market=market, system=system, replacement_delay_s=args.replacement_delay,
                        notices=not args.no_notices, parameter_servers=args.parameter_servers,
                        staleness_speedup=args.staleness_speedup, schedule=parse_schedule(args.schedule))
                for shape in shapes for market in parse_list(args.market, "--market")
                for system in parse_list(args.system, "--system")]
    band = parse_band(args.revocation_rate) if args.revocation_rate is not None else None
    revocations = "rate" if band is not None else args.revocations
    rentals = rentals_from(args, {gpu for cluster in clusters for gpu in cluster.slot_gpus})
    trace = args.trace
    if trace and Path(trace).is_dir():  # a run directory: its own revocations (run_trace.py)
        from transientvod.planner.run_trace import write_trace_from_run

        trace, note = write_trace_from_run(trace)
        print(f"replaying {note}; trace written to {trace}")
        trace = str(trace)
    simulator = Simulator(workload, seed=args.seed, recovery_s=args.recovery_seconds, trace_path=trace,
                          revocation_rate=band, rentals=rentals)
    rows = [simulator.run(cluster, args.runs, revocations).stats() for cluster in clusters]
    source = (f"an interruption rate of {band.label} (exponential lives; no trace)" if band is not None
              else "the study's VM lifetimes" if args.revocations == "lifetimes"
              else f"the trace {args.trace}" if args.trace else "the study's traces")
    print(f"{args.runs} simulated runs of {workload.steps} steps per configuration, revocations from "
          f"{source} (seed {args.seed}); "
          "time and cost over the runs that finished.")
    print(MEASURES + ":")
    print(format_rows(rows), end="")
    if args.csv:
        print(f"wrote {write_csv(rows, args.csv)}")
    return 0


# -- plan ------------------------------------------------------------------------------------

def risk(outcome: Outcome, budget: float | None, deadline_h: float | None) -> float:
    """The chance that a run fails, or costs more than the budget, or ends after the deadline."""
    bad = outcome.failed.copy()
    if budget is not None:
        bad |= outcome.cost_usd > budget
    if deadline_h is not None:
        bad |= outcome.time_h > deadline_h
    return float(bad.mean())


def cluster_shapes(gpus: list[str], max_workers: int, mixed: bool) -> list[dict]:
    """Every size of every type, and with `mixed` every pair of types (1 or more of each) up to
    max_workers servers in all."""
    shapes = [{"gpu": gpu, "workers": n} for gpu in gpus for n in range(1, max_workers + 1)]
    if mixed:
        shapes += [{"mix": ((a, i), (b, n - i))} for x, a in enumerate(gpus) for b in gpus[x + 1:]
                   for n in range(2, max_workers + 1) for i in range(1, n)]
    return shapes


def run_plan(args) -> int:
    if (args.budget is None) == (args.deadline is None):
        raise PlanError("give exactly one of --budget DOLLARS or --deadline HOURS.")
    limit = args.budget if args.budget is not None else args.deadline
    if not (limit > 0):
        raise PlanError(f"{'--budget' if args.budget is not None else '--deadline'} is {limit}; it must be positive.")
    if not 0 <= args.risk < 1:
        raise PlanError(f"--risk is {args.risk}; give the largest acceptable chance of failing, from 0 to below 1.")
    gpus = [server_type(g) for g in parse_list(args.gpus, "--gpus")]
    workload = workload_from(args, gpus[0])
    band = parse_band(args.revocation_rate) if args.revocation_rate is not None else None
    revocations = "rate" if band is not None else "lifetimes"
    simulator = Simulator(workload, seed=args.seed, recovery_s=args.recovery_seconds, revocation_rate=band,
                          rentals=rentals_from(args, gpus))
    candidates = []
    for shape in cluster_shapes(gpus, args.max_workers, args.mixed):
        for market in parse_list(args.markets, "--markets"):
            cluster = Cluster(**shape, market=market, system=args.system, replacement_delay_s=args.replacement_delay,
                              parameter_servers=args.parameter_servers, staleness_speedup=args.staleness_speedup)
            outcome = simulator.run(cluster, args.runs, revocations)
            row = outcome.stats()
            row["risk_pct"] = 100.0 * risk(outcome, args.budget, args.deadline)
            candidates.append(row)
    by_budget = args.budget is not None
    goal = "time_h_mean" if by_budget else "cost_usd_mean"
    what = f"costing more than ${args.budget:g}" if by_budget else f"taking longer than {args.deadline:g} h"
    fits = sorted((r for r in candidates if r["risk_pct"] <= 100 * args.risk), key=lambda r: r[goal])
    if not fits:
        safest = min(candidates, key=lambda r: r["risk_pct"])
        raise PlanError(f"no configuration keeps the risk of failing or {what} at or below {100 * args.risk:g} %; "
                        f"the safest, {safest['configuration']}, has {safest['risk_pct']:.0f} %; "
                        f"raise the {'budget' if by_budget else 'deadline'} or --max-workers, or accept more risk.")
    columns = COLUMNS[:1] + (("risk %", "risk_pct", ".1f"),) + COLUMNS[1:]
    source = f"an interruption rate of {band.label}" if band is not None else "the study's lifetimes"
    print(f"{len(candidates)} configurations, {args.runs} simulated runs each (revocations from {source}); "
          f"risk = chance of failing or {what}:")
    print(format_rows(fits[:args.top], columns), end="")
    print(why_the_winner_wins(fits, candidates, goal, by_budget, what, args.risk))
    if args.figure:
        from transientvod.planner.figure import cost_time_figure

        print(f"wrote {cost_time_figure(candidates, args.figure, fits, args.budget, args.deadline)}")
    return 0


def why_the_winner_wins(fits, candidates, goal, by_budget, what, tolerance) -> str:
    best = fits[0]
    measure = "fastest" if by_budget else "cheapest"

    def value(row):
        return f"{row['time_h_mean']:.2f} h" if by_budget else f"${row['cost_usd_mean']:.2f}"

    text = (f"\n{best['configuration']} wins: the {measure} ({value(best)} mean) of the {len(fits)} configurations "
            f"whose risk of failing or {what} is at most {100 * tolerance:g} % (its own: {best['risk_pct']:.1f} %).")
    if len(fits) > 1:
        text += f" Next: {fits[1]['configuration']} at {value(fits[1])}."
    better = [r for r in candidates if r not in fits and r[goal] < best[goal]]
    if better:
        excluded = min(better, key=lambda r: r[goal])
        text += (f" {excluded['configuration']} would be {measure.replace('est', 'er')} ({value(excluded)}) "
                 f"but its risk is {excluded['risk_pct']:.1f} %.")
    return text
