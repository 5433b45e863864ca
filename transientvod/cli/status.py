"""`transientvod status` and `down`: what a job has running and has cost, and the end of all of it."""
from __future__ import annotations

from transientvod.cli.fleet import parse_prices
from transientvod.config import ConfigError, load_config


def add_parser(subparsers) -> None:
    for name, text in (("status", "what a job has running, what it has cost, its step and its last notice, "
                                  "read from the cloud"),
                       ("down", "terminate every instance of a job; its fleet stops too")):
        verb = subparsers.add_parser(name, help=text)
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
