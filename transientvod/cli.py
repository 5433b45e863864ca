"""`transientvod ...` commands.

    transientvod demo                     the main job on the embedded digits data, losing and regaining a host
    transientvod train --config FILE [--set section.key=value ...] [--discovery "COMMAND"] [--budget DOLLARS]
                       [--script my_train.py -- ARGS]
                                          library mode: horovodrun's workers run your own script
    transientvod watch --config FILE      keep the host-state file for the spot_hosts discovery current
    transientvod doctor                   which kernel backend each op uses on this machine, and why
    transientvod install-horovod          build (once, cached) and install the patched Horovod for this Python
    transientvod compare [--experiment NAME] [--baseline RUN_ID] [--out DIR] [RUN_ID ...]
                                          the study's table (time, cost, accuracy, speed-up, savings)
                                          from the runs in MLflow, plus a CSV and a cost-vs-accuracy PNG
    transientvod simulate [--workers 2,4,8] [--market spot,on-demand] [--system study,elastic] ...
                                          predicted time, cost, failure of clusters from the study's revocations
    transientvod plan --budget DOLLARS | --deadline HOURS [--gpus k80,v100 --speed v100=14.2]
                                          the best clusters for a budget or deadline, and why
    transientvod fleet --job-tag JOB --instance-types T1,T2 --target N --image-id AMI --price T1=0.9
                       --budget DOLLARS | --no-budget ...
                       [--ssh-public-key ~/.ssh/id_ed25519.pub --horovod-wheel s3://... --print-user-data]
                                          keep N spot instances alive within a budget (all terminated once
                                          the projected spend reaches it), then terminate them;
                                          their user data installs the project and takes the launcher's key
    transientvod status --job-tag JOB [--checkpoint-dir s3://... --queue-url URL --config FILE --json]
                                          what the job has running and has cost, its step and world size
                                          from its newest checkpoint, its last interruption notice (from EC2)
    transientvod down --job-tag JOB [--json]
                                          terminates every instance of the job; a fleet of the job stops
    transientvod aws setup --job-tag JOB --region R [--config FILE] [--fragment FILE] [--ssh-from CIDR] [--vpc-id VPC]
                                          the SQS queue, EventBridge rules and worker role queue mode needs,
                                          and the hosts' security group (docs/network.md)
    transientvod aws teardown --job-tag JOB --region R
                                          removes what setup made
    transientvod testbed up --hosts N [--bandwidth 100mbit] [--private-disk DIR] | down | status
                         | vanish HOST | kill HOST | restore HOST | exec -- COMMAND | boot HOST --user-data FILE
                                          a real cluster on this machine (root): namespaced hosts with sshd

With `spot.provider` set (trace, aws or gce), `train` starts the watcher itself and uses
`python -m transientvod.launch.spot_hosts` (launch/spot_hosts.py of a checkout) as the discovery
script; `watch` is for running the watcher apart (for example on the machine where you run
horovodrun by hand), and prints that command.

Errors a user can cause end in one sentence on stderr and exit code 2. A `train` or `fleet`
stopped by its budget says so in one sentence and exits with code 4 (docs/budget.md).
"""
from __future__ import annotations

import argparse
import getpass
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from transientvod.config import DEFAULT_EXPERIMENT, DEFAULT_OUTPUT_DIR, Config, ConfigError, load_config
from transientvod.head.launcher import LaunchError, format_summary, run_job
from transientvod.head.spot_watcher import revocation, spot_hosts_command
from transientvod.process_exit import exit_now
from transientvod.testbed import TestbedError
from transientvod.version import __version__

# The exit code of a job or fleet that stopped because its projected spend reached its budget:
# not a failure (the work is in a durable checkpoint), but not finished either.
BUDGET_STOPPED_EXIT = 4
# Shipped inside the package (configs/ and launch/ of the checkout; see setup.py), so that an
# installed wheel runs the demo and builds Horovod without a checkout.
DEMO_CONFIG = resources.files("transientvod.configs") / "demo.yaml"
INSTALL_HOROVOD = resources.files("transientvod.launch") / "install_horovod.sh"


def demo_discovery(config: Config) -> str:
    """Both local hosts; 127.0.0.1 leaves at 30% of the steps and comes back at 60%."""
    leave, rejoin = int(config.train.steps * 0.3), int(config.train.steps * 0.6)
    progress = config.run_dir / "metrics.jsonl"
    return (f"{shlex.quote(sys.executable)} -m transientvod.launch.local_hosts "
            f"--phase 0=localhost:1,127.0.0.1:1 --phase {leave}=localhost:1 "
            f"--phase {rejoin}=localhost:1,127.0.0.1:1 --progress {shlex.quote(str(progress))}")


def cmd_demo(args) -> int:
    with resources.as_file(DEMO_CONFIG) as path:
        config = load_config(path, args.set)
    # The demo always starts from step 0: its own run directory is scratch space.
    if config.run_dir.exists():
        shutil.rmtree(config.run_dir)
    print(f"transientvod demo: {config.train.steps} steps of ResNet-{config.model.depth} "
          f"(width {config.model.width}) on scikit-learn's digits, 2 local hosts; 127.0.0.1 is "
          f"revoked at step {int(config.train.steps * 0.3)} and returns at step {int(config.train.steps * 0.6)}.",
          flush=True)
    return finish(run_job(config, demo_discovery(config)))


def cmd_train(args) -> int:
    # --budget is cost.budget_usd (the rules check it); the last of the overrides wins.
    overrides = args.set + ([f"cost.budget_usd={args.budget!r}"] if args.budget is not None else [])
    config = load_config(args.config, overrides)
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    if script_args and not args.script:
        raise ConfigError(f"{' '.join(script_args)} after the options are a script's arguments; give the script "
                          "with --script, or leave them out.")
    from transientvod.ending_signals import EndingSignal
    try:
        result = run_job(config, args.discovery, [args.script, *script_args] if args.script else None)
    except EndingSignal as e:
        print(f"transientvod: {e.name} stopped the job (horovodrun and its workers ended); the same command "
              "resumes it from its last durable checkpoint.", file=sys.stderr, flush=True)
        return e.exit_code
    return finish(result)


def cmd_doctor(args) -> int:
    import torch

    from transientvod.gradients import ops

    devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if torch.cuda.is_available() else [])
    ops_names = ("compress_ef_", "decompress_avg_", "decompress_sum_")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}); "
          f"{ops.KERNELS_ENV}={os.environ.get(ops.KERNELS_ENV, '') or '(unset)'}")
    for device in devices:
        try:
            backend, why = ops.backend_for(device)
        except RuntimeError as e:  # an unusable TRANSIENTVOD_KERNELS: one sentence, not a traceback
            raise ConfigError(str(e)) from None
        for name in ops_names:
            print(f"  {name:<26} on {str(device):<6} -> {backend:<6} ({why})")
    if not torch.cuda.is_available():
        print("  no CUDA device here: CUDA tensors would use the compiled extension, else cupy, else torch")
    return 0


def cmd_watch(args) -> int:
    from transientvod.spot.providers.from_config import provider_from_config
    from transientvod.spot.reach.gate import gate_for
    from transientvod.spot.watch import watch

    config = load_config(args.config, args.set)
    if config.spot.provider == "none":
        raise ConfigError("spot.provider is none; set it to trace, aws or gce to watch spot hosts.")
    provider = provider_from_config(config.spot, start_time=time.time())
    print(f"transientvod watch: writing {config.host_state_file} every {config.spot.poll_seconds:g} s; "
          f"discovery: {spot_hosts_command(config.host_state_file)}", flush=True)
    try:
        watch(provider, config.host_state_file, poll_seconds=config.spot.poll_seconds,
              revoke=revocation(config) if config.spot.provider == "trace" else None, gate=gate_for(config.spot))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_install_horovod(args) -> int:
    """Build (once per torch build and Python, cached) and install the patched Horovod into this
    Python's environment: the packaged launch/install_horovod.sh, run with this interpreter."""
    with resources.as_file(INSTALL_HOROVOD) as script:
        try:
            env = dict(os.environ, PYTHON=sys.executable, WHEEL_PATH_ONLY="1" if args.wheel_path else "")
            return subprocess.run(["bash", str(script)], env=env).returncode
        except FileNotFoundError:
            raise ConfigError("install-horovod runs a bash script and bash is not installed; install bash.") from None


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


# The watchdog's limit spans at least this many heartbeats: one CreateTags that fails is no ending.
WATCHDOG_PASSES = 3
WATCHDOG_DEFAULT_MINUTES = 10.0  # spot/watchdog.py's DEFAULT_MINUTES (tests/spot/test_watchdog.py checks)


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


def job_target(args) -> dict:
    """The job `status` and `down` act on: --job-tag, --region, --endpoint-url, --queue-url and
    --checkpoint-dir as given, else from --config's spot: and checkpoint: sections."""
    config = load_config(args.config, args.set) if args.config or args.set else None
    spot = config.spot if config is not None else None
    target = {
        "job_tag": args.job_tag or (spot.job_tag if spot else ""),
        "region": args.region or (spot.region if spot else "") or None,
        "endpoint_url": args.endpoint_url or (spot.endpoint_url if spot else "") or None,
        "queue_url": getattr(args, "queue_url", "") or (spot.queue_url if spot else ""),
        "checkpoint_dir": getattr(args, "checkpoint_dir", "") or (config.checkpoint_dir if config else ""),
    }
    if not target["job_tag"]:
        raise ConfigError(f"{args.command} needs the job's tag; give --job-tag JOB (the value of the transientvod:job "
                          "tag) or --config FILE with spot.job_tag.")
    return target


def cmd_status(args) -> int:
    import json

    from transientvod.spot.provisioning.job_instances import JobInstances
    from transientvod.spot.provisioning.job_status import format_status, job_status

    target = job_target(args)
    job = JobInstances(target["job_tag"], target["region"], target["endpoint_url"], whose="your")
    status = job_status(job, parse_prices(args.price), target["queue_url"])
    status["checkpoint"] = checkpoint_status(target["checkpoint_dir"], target["endpoint_url"])
    print(json.dumps(status, indent=2) if args.json else format_status(status), flush=True)
    return 0


def checkpoint_status(checkpoint_dir: str, endpoint_url: str | None) -> dict:
    """The step and world size of the job's newest durable checkpoint, or why there are none."""
    if not checkpoint_dir:
        return {"unavailable": "no checkpoint dir given (--checkpoint-dir or --config)"}
    from transientvod.checkpoint.progress import newest_progress

    progress = newest_progress(checkpoint_dir, endpoint_url)
    if progress is None:
        return {"unavailable": f"no checkpoint in {checkpoint_dir} yet", "location": checkpoint_dir}
    return {"step": progress.step, "world_size": progress.world_size, "location": progress.location}


def cmd_down(args) -> int:
    import json

    from transientvod.spot.provisioning.job_instances import JobInstances, describe_ended

    target = job_target(args)
    job = JobInstances(target["job_tag"], target["region"], target["endpoint_url"], whose="your")
    ended = job.end_all(by="down")
    sentence = describe_ended(job.job_tag, ended, "down")
    if ended:
        sentence += " A transientvod fleet of this job stops at its next pass and launches no replacement."
    if args.json:
        print(json.dumps({"job_tag": job.job_tag, "region": job.region,
                          "ended": [{"instance_id": e.instance_id, "instance_type": e.instance_type,
                                     "state": e.state} for e in ended], "message": sentence}, indent=2))
    else:
        print(f"transientvod down: {sentence}", flush=True)
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


def cmd_aws(args) -> int:
    from transientvod.spot.provisioning.aws_setup import AwsSetup, config_fragment

    s3_prefix = ""
    if args.action == "setup" and (args.config or args.set):
        checkpoint_dir = load_config(args.config, args.set).checkpoint.dir
        s3_prefix = checkpoint_dir if checkpoint_dir.startswith("s3://") else ""
    try:
        setup = AwsSetup(args.job_tag, args.region, endpoint_url=args.endpoint_url, s3_prefix=s3_prefix,
                         ssh_from=getattr(args, "ssh_from", "") or "", vpc_id=getattr(args, "vpc_id", "") or "")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    names = setup.names
    if args.action == "teardown":
        print(f"transientvod aws teardown: job {names.job_tag} in {args.region}", flush=True)
        setup.teardown()
        return 0
    print(f"transientvod aws setup: job {names.job_tag} in {args.region}"
          + (f", workers may read and write {s3_prefix}" if s3_prefix else ""), flush=True)
    queue_url = setup.setup()
    fragment = Path(args.fragment or f"transientvod-aws-{names.job_tag}.yaml")
    fragment.write_text(config_fragment(names.job_tag, args.region, queue_url, args.endpoint_url))
    print(f"transientvod aws setup: queue {queue_url} written to {fragment}; launch the workers with "
          f"instance profile {names.instance_profile} (aws ec2 run-instances --iam-instance-profile "
          f"Name={names.instance_profile}) and security group {names.security_group} (fleet uses both).", flush=True)
    if not setup.ssh_from:
        print(f"transientvod aws setup: no --ssh-from, so SSH reaches the hosts only from members of "
              f"{names.security_group}: run the launcher on an instance in it, or run setup again with --ssh-from "
              "YOUR_ADDRESS/32.", flush=True)
    return 0


def finish(result) -> int:
    if result.returncode != 0 or result.summary is None:
        print(f"transientvod: {result.why}" if result.why else
              f"transientvod: the job failed (horovodrun exit code {result.returncode}); "
              "the worker logs above say why.", file=sys.stderr)
        return result.returncode or 1
    stop = result.summary.get("budget_stop")
    if stop is not None:
        print("\ntransientvod: job stopped by its budget\n" + format_summary(result.summary), flush=True)
        print(f"transientvod: {stop['sentence']}", flush=True)
        return BUDGET_STOPPED_EXIT
    print("\ntransientvod: job finished\n" + format_summary(result.summary), flush=True)
    return 0


def cmd_compare(args) -> int:
    from transientvod.tracking.compare import run_compare
    from transientvod.tracking.store import store_uri

    return run_compare(store_uri(args.tracking_uri or ""), args.experiment, args.runs, args.baseline, args.out)


def cmd_simulate(args) -> int:
    from transientvod.planner.commands import run_simulate

    return run_simulate(args)


def cmd_plan(args) -> int:
    from transientvod.planner.commands import run_plan

    return run_plan(args)


def cmd_testbed(args) -> int:
    from transientvod.testbed import cluster

    if args.action == "up":
        record = cluster.up(args.name, args.hosts, args.bandwidth, tuple(args.private_disk), args.congestion)
        layout = record.layout
        print(f"testbed {layout.name}: head {layout.head.name} ({layout.head.address}), hosts "
              + ", ".join(f"{h.name} ({h.address})" for h in layout.hosts)
              + (f"; each host's egress shaped to {layout.bandwidth}" if layout.bandwidth else "; links unshaped")
              + (f"; TCP congestion control {layout.congestion}" if layout.congestion else "")
              + private_disk_words(record.private_disk)
              + f". Run commands on the head with: transientvod testbed exec --name {layout.name} -- COMMAND")
    elif args.action == "down":
        cluster.down(args.name)
        print(f"testbed {args.name}: removed")
    elif args.action == "status":
        rows = cluster.status(args.name)
        columns = ("host", "address", "condition", "link", "sshd", "shaping", "congestion")
        widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
        for row in [dict(zip(columns, columns))] + rows:
            print("  ".join(str(row[c]).ljust(widths[c]) for c in columns).rstrip())
        from transientvod.testbed.record import require_record
        private = require_record(args.name).private_disk
        if private:
            print(private_disk_words(private).lstrip("; "))
    elif args.action == "exec":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return cluster.exec_on_head(args.name, command)
    elif args.action == "boot":
        from transientvod.testbed.boot import boot
        sys.stdout.write(boot(args.name, args.host, Path(args.user_data)))
        print(f"testbed {args.name}: {args.host} booted from {args.user_data}")
    else:  # vanish, kill, restore
        getattr(cluster, args.action)(args.name, args.host)
        done = {"vanish": "vanished", "kill": "killed", "restore": "restored"}[args.action]
        print(f"testbed {args.name}: {args.host} {done}")
    return 0


def private_disk_words(directories: list[str]) -> str:
    if not directories:
        return ""
    return (f"; each host has its own {', '.join(directories)} (empty at start and after restore; "
            "the head has this machine's)")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transientvod", description="elastic training on transient servers")
    parser.add_argument("--version", action="version", version=f"transientvod {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the main job on the embedded digits data set")
    demo.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="override a config value (repeatable)")
    demo.set_defaults(func=cmd_demo)
    train = sub.add_parser("train", help="start an elastic job through horovodrun")
    train.add_argument("--config", help="a YAML file listing what differs from the defaults")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config value (repeatable)")
    train.add_argument("--budget", type=float, metavar="DOLLARS",
                       help="cost.budget_usd: the most the job may cost; as its projected spend reaches it, the job "
                            "commits, writes a durable checkpoint and ends with exit code 4 (docs/budget.md)")
    train.add_argument("--discovery", help="host discovery command (default: cluster.discovery_script)")
    train.add_argument("--script", help="a Horovod elastic script of your own (library mode, docs/library-mode.md) "
                       "that the workers run in place of the task loop")
    train.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                       help="the script's own arguments, after --")
    train.set_defaults(func=cmd_train)
    watcher = sub.add_parser("watch", help="run the spot watcher that feeds the spot_hosts discovery")
    watcher.add_argument("--config", help="a YAML file with a spot: section")
    watcher.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                         help="override a config value (repeatable)")
    watcher.set_defaults(func=cmd_watch)
    doctor = sub.add_parser("doctor", help="which kernel backend each op uses here, and why")
    doctor.set_defaults(func=cmd_doctor)
    install_horovod = sub.add_parser("install-horovod", help="build (cached) and install the patched Horovod "
                                     "for this Python and its torch (HOROVOD_SDIST=FILE: without PyPI)")
    install_horovod.add_argument("--wheel-path", action="store_true",
                                 help="print only the cached wheel's path (to upload for fleet --horovod-wheel)")
    install_horovod.set_defaults(func=cmd_install_horovod)
    compare = sub.add_parser("compare", help="compare runs recorded in MLflow: time, cost, accuracy")
    compare.add_argument("runs", nargs="*", metavar="RUN_ID", help="these runs, in this order (default: the experiment's)")
    compare.add_argument("--experiment", help=f"the MLflow experiment (default: {DEFAULT_EXPERIMENT})")
    compare.add_argument("--baseline", metavar="RUN_ID",
                         help="speed-up and savings relative to this run (default: the smallest on-demand run)")
    compare.add_argument("--out", default=str(Path(DEFAULT_OUTPUT_DIR) / "compare"),
                         help="where compare.csv and compare.png go")
    compare.add_argument("--tracking-uri", help="the MLflow store (default: $MLFLOW_TRACKING_URI, else "
                         f"sqlite:///{DEFAULT_OUTPUT_DIR}/mlflow.db)")
    compare.set_defaults(func=cmd_compare)
    simulate = sub.add_parser("simulate", help="predict time, cost and failure of clusters from real revocations")
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
    plan = sub.add_parser("plan", help="search clusters for a budget or a deadline")
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
    fleet = sub.add_parser("fleet", help="keep N spot instances alive for a job, within a budget")
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
    for name, text in (("status", "what a job has running, what it has cost, its step and its last notice, "
                                  "read from the cloud"),
                       ("down", "terminate every instance of a job; its fleet stops too")):
        verb = sub.add_parser(name, help=text)
        verb.add_argument("--job-tag", default="", help="value of the transientvod:job tag (default: --config's "
                          "spot.job_tag)")
        verb.add_argument("--region", default="", help="the job's region (default: --config's, else boto3's)")
        verb.add_argument("--endpoint-url", default="", help="an AWS-compatible endpoint instead of AWS's own")
        verb.add_argument("--config", help="the job's config: its spot: and checkpoint: sections fill in the rest")
        verb.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                          help="override a config value (repeatable)")
        verb.add_argument("--json", action="store_true", help="print JSON for scripts")
        if name == "status":
            verb.add_argument("--checkpoint-dir", default="", metavar="s3://BUCKET/PREFIX | DIR",
                              help="the job's checkpoint.dir: its newest checkpoint gives the step and world size")
            verb.add_argument("--queue-url", default="", help="the job's notice queue (aws setup made it), looked "
                              "at without taking its messages")
            verb.add_argument("--price", action="append", default=[], metavar="TYPE=DOLLARS_PER_HOUR",
                              help="what an instance type costs an hour (repeatable); default: the built-in "
                                   "on-demand table, the most a spot instance costs at EC2's default maximum price")
            verb.set_defaults(func=cmd_status)
        else:
            verb.set_defaults(func=cmd_down)
    aws = sub.add_parser("aws", help="make or remove the queue, rules and role that queue mode needs")
    aws_verbs = aws.add_subparsers(dest="action", required=True)
    for action, text in (("setup", "make what is missing (twice makes nothing new)"),
                         ("teardown", "remove all that setup made")):
        verb = aws_verbs.add_parser(action, help=text)
        verb.add_argument("--job-tag", required=True, help="value of the transientvod:job tag; names every part")
        verb.add_argument("--region", required=True, help="the region of the job's instances, for example us-east-1")
        verb.add_argument("--endpoint-url", help="an AWS-compatible endpoint instead of AWS's own")
        if action == "setup":
            verb.add_argument("--config", help="the job's config: an s3:// checkpoint.dir lets workers use that prefix")
            verb.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                              help="override a config value (repeatable)")
            verb.add_argument("--fragment", help="where the spot: config goes (default: transientvod-aws-JOB.yaml)")
            verb.add_argument("--ssh-from", metavar="CIDR", default="",
                              help="the launcher's public address or network, which may reach the hosts' SSH "
                                   "(default: none; members of the job's security group only)")
            verb.add_argument("--vpc-id", default="", help="the VPC of the hosts' security group (default: the "
                                                           "region's default VPC)")
    aws.set_defaults(func=cmd_aws)
    testbed = sub.add_parser("testbed", help="a real cluster on this machine: namespaced hosts with sshd (root)")
    actions = testbed.add_subparsers(dest="action", required=True)
    helps = {"up": "make the head and N hosts", "down": "remove all the testbed made",
             "status": "hosts, addresses, link, sshd and shaping", "vanish": "the host disappears from the network",
             "kill": "the host's processes are killed", "restore": "a replacement server comes back",
             "exec": "run a command on the head (after --)",
             "boot": "the host's sshd stops and it runs user data as a new VM would (fleet --print-user-data)"}
    for action, text in helps.items():
        verb = actions.add_parser(action, help=text)
        verb.add_argument("--name", default="tvd", help="the testbed's name, the prefix of its hosts (default: tvd)")
        if action == "up":
            verb.add_argument("--hosts", type=int, default=3, help="how many hosts (2..64)")
            verb.add_argument("--bandwidth", default="",
                              help="each host's egress rate, for example 100mbit; RATE/QUEUE sets how long a packet "
                                   "may wait in tbf's queue before it is dropped (default 50ms), e.g. 25mbit/400ms")
            verb.add_argument("--congestion", default="",
                              help="every machine's TCP congestion control, for example cubic or bbr (default: "
                                   "this machine's, net.ipv4.tcp_congestion_control)")
            verb.add_argument("--private-disk", action="append", default=[], metavar="DIR",
                              help="each host gets an empty DIR of its own, seen by no other host nor the head, as "
                                   "VMs that share no file system (repeatable; made if missing)")
        elif action in ("vanish", "kill", "restore"):
            verb.add_argument("host", help="a host of the testbed, for example tvd-h2")
        elif action == "exec":
            verb.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
        elif action == "boot":
            verb.add_argument("host", help="a host of the testbed, for example tvd-h2")
            verb.add_argument("--user-data", required=True, help="the script to run, as root, in the foreground")
    testbed.set_defaults(func=cmd_testbed)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except (ConfigError, LaunchError, TestbedError) as e:
        print(f"transientvod: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # data, checkpoint and provider errors are user-fixable too
        from transientvod.billing.prices import PriceError
        from transientvod.checkpoint import CheckpointError
        from transientvod.tasks.resnet.data import DataError
        from transientvod.planner.study_data import PlanError
        from transientvod.spot.providers.provider import ProviderError
        from transientvod.tracking.store import TrackingError  # compare's CompareError is one too
        if isinstance(e, (DataError, CheckpointError, ProviderError, PriceError, TrackingError,
                          PlanError)):
            print(f"transientvod: {e}", file=sys.stderr)
            return 2
        raise


def console_main() -> None:
    """The `transientvod` command (pyproject.toml's entry point)."""
    exit_now(main())


if __name__ == "__main__":
    console_main()
