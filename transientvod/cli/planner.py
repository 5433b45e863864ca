"""`transientvod simulate` and `plan`: the planner's predictions and search (transientvod/planner/)."""
from __future__ import annotations


def add_parser(subparsers) -> None:
    simulate = subparsers.add_parser("simulate", help="predict time, cost and failure of clusters from real revocations")
    simulate.add_argument("--gpu", default="k80",
                          help="comma-separated GPU types (k80, p100, v100) or instance types (g5.xlarge, ...)")
    simulate.add_argument("--workers", default="4",
                          help="comma-separated cluster sizes, or one mixed cluster as GPU:COUNT,... (k80:2,p100:2)")
    simulate.add_argument("--market", default="spot", help="comma-separated: spot, on-demand")
    simulate.add_argument("--system", default="elastic",
                          help="comma-separated: elastic (this project), study (async PS, master fatal), restart")
    simulate.add_argument("--revocations", default="trace", choices=("trace", "lifetimes"),
                          help="replay the study's K80 cluster traces, or draw from its VM lifetimes")
    simulate.add_argument("--revocation-rate", metavar="BAND",
                          help="a cloud without traces: servers interrupted a month, one of the bands EC2's Spot "
                               "Instance Advisor publishes (<5, 5-10, 10-15, 15-20, >20); replaces --revocations")
    simulate.add_argument("--trace", metavar="CSV|RUN_DIR",
                          help="replay your own trace (VM_name,Uptime,Revoked), or the revocations a job recorded "
                               "in its run directory (runs/NAME), instead of the study's")
    simulate.add_argument("--runs", type=int, default=10000, help="Monte Carlo runs per configuration")
    simulate.add_argument("--no-notices", action="store_true", help="revocations come without notice")
    simulate.add_argument("--csv", help="also write the table as CSV here")
    simulate.add_argument("--schedule", metavar="STEP:+N,...",
                          help="a growing cluster: add N servers when the job reaches STEP (16000:+1,32000:+1)")
    add_workload_arguments(simulate)
    simulate.set_defaults(func=cmd_simulate)
    plan = subparsers.add_parser("plan", help="search clusters for a budget or a deadline")
    plan.add_argument("--budget", type=float, metavar="DOLLARS")
    plan.add_argument("--deadline", type=float, metavar="HOURS")
    plan.add_argument("--gpus", default="k80",
                      help="comma-separated GPU or instance types to consider (k80, g5.xlarge, a2-highgpu-1g, ...)")
    plan.add_argument("--revocation-rate", metavar="BAND",
                      help="revocations from a Spot Instance Advisor band (<5, 5-10, 10-15, 15-20, >20) instead of "
                           "the study's lifetimes; needed for today's instance types")
    plan.add_argument("--markets", default="spot,on-demand", help="comma-separated markets to consider")
    plan.add_argument("--max-workers", type=int, default=8)
    plan.add_argument("--mixed", action="store_true", help="also consider clusters of two GPU types (--gpus)")
    plan.add_argument("--system", default="elastic", choices=("elastic", "study", "restart"))
    plan.add_argument("--risk", type=float, default=0.1, help="largest acceptable chance of failing or going over")
    plan.add_argument("--runs", type=int, default=2000, help="Monte Carlo runs per configuration")
    plan.add_argument("--top", type=int, default=5)
    plan.add_argument("--figure", default="runs/plan.png", metavar="PNG",
                      help="the cost-against-time picture of every configuration with its risk (default "
                           "runs/plan.png; '' for none)")
    add_workload_arguments(plan)
    plan.set_defaults(func=cmd_plan)


def add_workload_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=64000, help="training steps of the job (default: the study's 64K)")
    parser.add_argument("--speed", action="append", default=[], metavar="GPU=STEPS_PER_S",
                        help="measured steps/s of one server of a type (k80 is calibrated from the study)")
    parser.add_argument("--speed-from-run", action="append", default=[], metavar="[GPU=]RUN",
                        help="steps/s at every world size from a run: its directory (runs/NAME) or its MLflow run "
                             "id (default GPU: the first asked for); --steps then counts that run's batches")
    parser.add_argument("--tracking-uri", help="the MLflow store of a --speed-from-run run id (default: the project's)")
    parser.add_argument("--region", default="us-east-1",
                        help="AWS instance types (g4dn, g5, g6, p3, p4d, p5): the region of the spot prices")
    parser.add_argument("--endpoint-url", help="the EC2 endpoint to ask for prices and GPU counts (default: AWS's)")
    parser.add_argument("--price-days", type=float, default=7.0, metavar="DAYS",
                        help="days of EC2 spot price history to read (default 7)")
    parser.add_argument("--prices", metavar="CSV",
                        help="on-demand prices (instance_type,on_demand_usd_per_hour) over the built-in tables")
    parser.add_argument("--replacement-delay", type=float, default=float("inf"), metavar="SECONDS",
                        help="a revoked server is replaced after this long (default: never)")
    parser.add_argument("--parameter-servers", type=int, default=None,
                        help="always-on CPU servers billed on-demand (default: 1 for --system study, as the study "
                             "had; else 0)")
    parser.add_argument("--commit-every", type=int, default=50, help="elastic: steps lost at most without a notice")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="restart: steps lost at most per revocation")
    parser.add_argument("--recovery-seconds", type=float, help="pause per membership change (default by system)")
    parser.add_argument("--staleness-speedup", type=float, default=1.0, metavar="FACTOR",
                        help="bounded staleness: throughput x FACTOR (1.32 measured here at s=2 with a straggler)")
    parser.add_argument("--seed", type=int, default=0)


def cmd_simulate(args) -> int:
    from transientvod.planner.commands import run_simulate

    return run_simulate(args)


def cmd_plan(args) -> int:
    from transientvod.planner.commands import run_plan

    return run_plan(args)
