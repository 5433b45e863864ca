"""`transientvod aws setup` and `teardown`: what queue mode and the fleet need in an AWS account."""
from __future__ import annotations

from pathlib import Path

from transientvod.config import ConfigError, load_config


def add_parser(subparsers) -> None:
    aws = subparsers.add_parser("aws", help="make or remove the queue, rules and role that queue mode needs")
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
