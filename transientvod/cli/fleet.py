"""`transientvod fleet`: keep N spot instances of a job alive within a budget."""
from __future__ import annotations

import getpass
import sys

from transientvod.cli.train import BUDGET_STOPPED_EXIT
from transientvod.config import ConfigError

# The watchdog's limit spans at least this many heartbeats: one CreateTags that fails is no ending.
WATCHDOG_PASSES = 3
WATCHDOG_DEFAULT_MINUTES = 10.0  # spot/watchdog.py's DEFAULT_MINUTES (tests/spot/test_watchdog.py checks)


def add_parser(subparsers) -> None:
    fleet = subparsers.add_parser("fleet", help="keep N spot instances alive for a job, within a budget")
    fleet.add_argument("--job-tag", required=True, help="value of the transientvod:job tag (what discovery lists)")
    fleet.add_argument("--instance-types", required=True, help="comma-separated, tried in order")
    fleet.add_argument("--target", type=int, required=True, help="instances to keep alive")
    fleet.add_argument("--image-id", required=True)
    fleet.add_argument("--price", action="append", default=[], metavar="TYPE=DOLLARS_PER_HOUR",
                       help="what to budget per hour for an instance type (repeatable); a type without one "
                            "is budgeted at its on-demand price, from the built-in us-east-1 table")
    fleet.add_argument("--budget", type=float, metavar="DOLLARS",
                       help="the most the whole job may cost, its instances already running included: as the "
                            "projected spend reaches it, the fleet terminates every instance and exits "
                            "(docs/budget.md)")
    fleet.add_argument("--no-budget", action="store_true",
                       help="run without a budget (a fleet refuses to start without one of the two)")
    fleet.add_argument("--region")
    fleet.add_argument("--endpoint-url")
    fleet.add_argument("--subnet-id")
    fleet.add_argument("--key-name")
    fleet.add_argument("--security-group-id", action="append", default=[],
                       help="(repeatable) default: transientvod-JOB-hosts when 'transientvod aws setup' made it")
    fleet.add_argument("--poll-seconds", type=float, default=30.0)
    join = fleet.add_argument_group("joining the job (the instances' user data)")
    join.add_argument("--ssh-public-key", metavar="PATH",
                      help="the .pub of the key the launcher's ssh uses: each instance installs the project, "
                           "then authorizes this key and starts sshd (without it: no user data)")
    join.add_argument("--ssh-user", default=getpass.getuser(),
                      help="the user horovodrun logs in as (default: yours, as ssh does without a User line)")
    join.add_argument("--project-spec", default="", metavar="s3://BUCKET/KEY.whl | REQUIREMENT",
                      help="transientvod to install at boot: the s3:// URL of its wheel ('pip wheel --no-deps .' in "
                           "a checkout), read with the instance profile, or a pip requirement such as "
                           "transientvod==VERSION (default: none, the image has it)")
    join.add_argument("--horovod-wheel", default="", metavar="s3://BUCKET/KEY.whl",
                      help="the patched Horovod wheel 'transientvod install-horovod' built and cached (default: "
                           "build it at boot, minutes)")
    join.add_argument("--torch-spec", default=launcher_torch(),
                      help="pip requirement of torch (default: the launcher's version, which the wheel was built for)")
    join.add_argument("--worker-venv", default=sys.prefix,
                      help="where the workers' venv goes (default: the launcher's, %(default)s: horovodrun runs the "
                           "launcher's python path on every host)")
    join.add_argument("--instance-profile", default="",
                      help="IAM instance profile of the instances, or 'none' (default: transientvod-JOB-worker "
                           "when 'transientvod aws setup' made it)")
    join.add_argument("--watchdog-minutes", type=float, default=WATCHDOG_DEFAULT_MINUTES,
                      help="an instance that has not heard the fleet's heartbeat this long shuts down and is "
                           "terminated (at least 2; docs/watchdog.md)")
    join.add_argument("--print-user-data", action="store_true", help="print the user data and exit; no AWS call")
    fleet.add_argument("--dry-run", action="store_true", help="print what it would do; change nothing")
    fleet.set_defaults(func=cmd_fleet)


def parse_prices(items: list[str]) -> dict[str, float]:
    prices = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            prices[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ConfigError(f"--price {item!r} must look like INSTANCE_TYPE=DOLLARS_PER_HOUR, for example p3.2xlarge=0.918.")
    return prices


def fleet_prices(instance_types: list[str], given: dict[str, float], region: str) -> dict[str, float]:
    """--price for each type that has one; the others at their on-demand price in `region`,
    which bounds what they can cost: the fleet asks for spot instances at EC2's default
    maximum price, the on-demand price. A type with neither is one sentence."""
    from transientvod.billing.prices import AWS_PRICE_TABLE_REGION, PriceCatalog, PriceError

    prices = dict(given)
    catalog = PriceCatalog("aws", region=region)
    for instance_type in instance_types:
        if instance_type in prices:
            continue
        try:
            prices[instance_type] = catalog.on_demand_hourly(instance_type)
        except PriceError:
            why = (f"the built-in on-demand table covers aws {AWS_PRICE_TABLE_REGION} only (this fleet runs in {region})"
                   if region not in ("", AWS_PRICE_TABLE_REGION) else "it is not in the built-in on-demand table")
            raise ConfigError(f"instance type {instance_type!r} has no --price and {why}; give "
                              f"--price {instance_type}=DOLLARS_PER_HOUR.") from None
        print(f"transientvod fleet: budgeting {instance_type} at its on-demand ${prices[instance_type]:g}/h "
              f"in {region or AWS_PRICE_TABLE_REGION}, the most a spot instance costs at EC2's default "
              f"maximum price; --price {instance_type}=... budgets lower.", flush=True)
    return prices


def launcher_torch() -> str:
    """torch at the launcher's version (without a local tag such as +cpu): the Horovod wheel
    was built against the torch the launcher runs."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"torch=={version('torch').split('+')[0]}"
    except PackageNotFoundError:
        return "torch"


def fleet_user_data(args) -> str:
    """The join script for --ssh-public-key and its options; without a key, the watchdog alone
    (every instance of a fleet ends itself when the fleet's heartbeat stops)."""
    from transientvod.spot.provisioning.user_data import JoinSpec, UserDataError, join_script, read_public_key, watchdog_script

    if not args.ssh_public_key and (args.horovod_wheel or args.project_spec):
        raise ConfigError("--horovod-wheel and --project-spec go into the user data, which needs the "
                          "launcher's key; give --ssh-public-key too.")
    try:
        if not args.ssh_public_key:
            script = watchdog_script(args.watchdog_minutes)
        else:
            script = join_script(JoinSpec(public_key=read_public_key(args.ssh_public_key), ssh_user=args.ssh_user,
                                          venv=args.worker_venv, project=args.project_spec,
                                          horovod_wheel=args.horovod_wheel, torch=args.torch_spec,
                                          region=args.region or "", watchdog_minutes=args.watchdog_minutes))
    except UserDataError as e:
        raise ConfigError(str(e)) from None
    if args.watchdog_minutes * 60 < WATCHDOG_PASSES * args.poll_seconds:
        raise ConfigError(f"--watchdog-minutes {args.watchdog_minutes:g} is shorter than {WATCHDOG_PASSES} of the "
                          f"fleet's passes (--poll-seconds {args.poll_seconds:g}), which write the heartbeat; "
                          "give more minutes or fewer seconds.")
    return script


def fleet_instance_profile(args) -> str:
    """--instance-profile as given; by default the one `aws setup` made for the job tag, when it
    exists: the workers need its credentials for S3 checkpoints and the Horovod wheel."""
    from transientvod.spot.provisioning.aws_setup import setup_instance_profile

    if args.instance_profile == "none":
        return ""
    if args.instance_profile:
        return args.instance_profile
    found = setup_instance_profile(args.job_tag, args.region, args.endpoint_url)
    if found:
        return found
    from_s3 = [name for name, value in (("--horovod-wheel", args.horovod_wheel), ("--project-spec", args.project_spec))
               if value.startswith("s3://")]
    if from_s3:
        raise ConfigError(f"the workers read {' and '.join(from_s3)} from S3 with an instance profile's credentials, "
                          f"and job {args.job_tag} has none; run 'transientvod aws setup --job-tag {args.job_tag}' or "
                          "give --instance-profile NAME.")
    print(f"transientvod fleet: no instance profile transientvod-{args.job_tag}-worker (transientvod aws setup "
          "makes it); the instances get no AWS credentials of their own.", flush=True)
    return ""


def fleet_security_groups(args) -> list[str]:
    """--security-group-id as given; by default the group `aws setup` made for the job tag, when
    it exists: its members reach each other on every TCP port, as Gloo and Horovod need."""
    from transientvod.spot.provisioning.aws_setup import setup_security_group

    if args.security_group_id:
        return list(args.security_group_id)
    found = setup_security_group(args.job_tag, args.region, args.endpoint_url)
    if found:
        return [found]
    print(f"transientvod fleet: no security group transientvod-{args.job_tag}-hosts (transientvod aws setup makes it); "
          "the instances get the VPC's default group, which must let them reach each other on every TCP port.",
          flush=True)
    return []


def cmd_fleet(args) -> int:
    import boto3

    from transientvod.billing.budget import BudgetError
    from transientvod.ending_signals import EndingSignal
    from transientvod.spot.provisioning.fleet import Fleet
    from transientvod.spot.provisioning.fleet_spec import FleetSpec

    user_data = fleet_user_data(args)
    if args.print_user_data:
        if not args.ssh_public_key:
            raise ConfigError("--print-user-data prints the join script, which needs --ssh-public-key.")
        sys.stdout.write(user_data)
        return 0
    check_fleet_budget(args)
    instance_types = [t for t in args.instance_types.split(",") if t]
    region = args.region or boto3.session.Session().region_name or ""
    try:
        spec = FleetSpec(job_tag=args.job_tag, instance_types=instance_types,
                         target=args.target, image_id=args.image_id,
                         hourly_price=fleet_prices(instance_types, parse_prices(args.price), region),
                         budget=args.budget, subnet_id=args.subnet_id, key_name=args.key_name,
                         security_group_ids=args.security_group_id, user_data=user_data)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if spec.budget is None:
        print(f"transientvod fleet: no budget (--no-budget): {fleet_hourly_cost(spec)}, and nothing stops the "
              "spending but you.", flush=True)
    # After every check of what was typed: this is the first AWS call.
    instance_profile = spec.instance_profile = fleet_instance_profile(args)
    groups = spec.security_group_ids = fleet_security_groups(args)
    if not args.ssh_public_key:
        print("transientvod fleet: no --ssh-public-key, so the user data only starts the watchdog: the image itself "
              "must run sshd with the launcher's key and have torch, Horovod and transientvod.", flush=True)
    fleet = Fleet(spec, region=args.region, endpoint_url=args.endpoint_url, dry_run=args.dry_run)
    joins = (f"{len(user_data.encode())} bytes of user data (the join script; --print-user-data shows it)"
             if args.ssh_public_key else f"{len(user_data.encode())} bytes of user data (the watchdog)")
    print(f"transientvod fleet: each instance gets {joins} and "
          + (f"instance profile {instance_profile}" if instance_profile else "no instance profile")
          + (f" and security group {', '.join(groups)}." if groups else "."), flush=True)
    if args.dry_run:
        try:
            fleet.check_budget_left()
        except BudgetError as e:
            raise ConfigError(str(e)) from None
        for action in fleet.reconcile():
            print(f"would {action.kind} {action.instance_type or ''} {action.instance_id or ''}: {action.reason}".strip())
        return 0
    print(f"transientvod fleet: keeping {spec.target} spot instances tagged {spec.tag_key}={spec.job_tag}; "
          "Ctrl-C, SIGTERM or SIGHUP terminates them all.", flush=True)
    try:
        fleet.run(poll_seconds=args.poll_seconds)
    except BudgetError as e:  # spent already: nothing was launched
        raise ConfigError(str(e)) from None
    except EndingSignal as e:  # run() has terminated every instance of the job by now
        from transientvod.spot.providers.provider import ProviderError
        try:
            spent = f"; spent ${fleet.spent():.2f}"
        except ProviderError:  # the exit code still says which signal: the sum is only a report
            spent = ""
        print(f"transientvod fleet: {e.name} ended the fleet; every instance of job {spec.job_tag} is "
              f"terminating{spent}", flush=True)
        return e.exit_code
    stop = fleet.budget_stop
    if stop is not None:
        print(f"transientvod fleet: job {spec.job_tag}'s projected spend ${stop.projected_usd:.2f} (spent "
              f"${stop.spent_usd:.2f} + ${stop.running_usd_per_hour:.2f}/h running for the next {stop.lead_seconds:g} "
              f"s) reached its budget of ${stop.budget_usd:.2f}, so the fleet terminated every instance of the job "
              "and stopped.", flush=True)
        return BUDGET_STOPPED_EXIT
    if fleet.ended_by is not None:
        who, instance_id = fleet.ended_by
        print(f"transientvod fleet: job {spec.job_tag} was ended by {'transientvod down' if who == 'down' else who} "
              f"(instance {instance_id} is marked {who}); the fleet stopped and terminated the rest.", flush=True)
    print(f"transientvod fleet: spent ${fleet.spent():.2f}", flush=True)
    return 0


def check_fleet_budget(args) -> None:
    """--budget is a positive number of dollars, or --no-budget is given (not both): a fleet
    whose spending nothing limits is the user's explicit choice."""
    from transientvod.billing.budget import BudgetError, check_budget

    if args.budget is not None and args.no_budget:
        raise ConfigError("--budget and --no-budget contradict each other; give one of them.")
    if args.budget is None and not args.no_budget:
        raise ConfigError(f"the fleet of job {args.job_tag} has no budget; give --budget DOLLARS, the most the whole "
                          "job may cost (its instances already running included), or --no-budget to run without a "
                          "limit.")
    try:
        check_budget(args.budget, "--budget")
    except BudgetError as e:
        raise ConfigError(str(e)) from None


def fleet_hourly_cost(spec) -> str:
    """What an hour of the fleet costs: `target` instances of the first type (the one it tries
    first), and the most it could cost if it falls back to the dearest type."""
    first = spec.instance_types[0]
    hourly = spec.target * spec.hourly_price[first]
    text = (f"an hour of the fleet's {spec.target} instances costs ${hourly:.2f} "
            f"({spec.target} x {first} at ${spec.hourly_price[first]:g}/h)")
    dearest = max(spec.instance_types, key=lambda t: spec.hourly_price[t])
    if spec.hourly_price[dearest] > spec.hourly_price[first]:
        text += (f", up to ${spec.target * spec.hourly_price[dearest]:.2f} if they are all {dearest} "
                 f"(${spec.hourly_price[dearest]:g}/h)")
    return text
