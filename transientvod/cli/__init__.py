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
import logging
import sys

from transientvod.cli import aws, compare, doctor, fleet, install_horovod, planner, status, testbed, train
from transientvod.config import ConfigError
from transientvod.head.launcher import LaunchError
from transientvod.process_exit import exit_now
from transientvod.testbed import TestbedError
from transientvod.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transientvod", description="elastic training on transient servers")
    parser.add_argument("--version", action="version", version=f"transientvod {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `transientvod --help` lists them.
    for command in (train, doctor, install_horovod, compare, planner, fleet, status, aws, testbed):
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except (ConfigError, LaunchError, TestbedError) as e:
        print(f"transientvod: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if not user_fixable(e):
            raise
        print(f"transientvod: {e}", file=sys.stderr)
        return 2


# Data, checkpoint, provider, price, tracking (compare's CompareError is one) and planner errors
# are user-fixable too. They are named, not imported: an error raised in a module means that
# module is loaded already, while importing them all here would load torch (the data module)
# for every mistake in a planner or AWS command: 2.3 s of a 2.8 s `transientvod simulate`.
USER_FIXABLE = {
    "transientvod.tasks.resnet.data.DataError",
    "transientvod.checkpoint.format.CheckpointError",
    "transientvod.spot.providers.provider.ProviderError",
    "transientvod.billing.prices.PriceError",
    "transientvod.tracking.store.TrackingError",
    "transientvod.planner.study_data.PlanError",
}


def user_fixable(error: Exception) -> bool:
    """Whether `error` is (or derives from) one of the USER_FIXABLE classes."""
    return any(f"{cls.__module__}.{cls.__qualname__}" in USER_FIXABLE for cls in type(error).__mro__)


def console_main() -> None:
    """The `transientvod` command (pyproject.toml's entry point)."""
    exit_now(main())
