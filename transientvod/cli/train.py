"""`transientvod demo`, `train` and `watch`: a job through horovodrun, and the spot watcher that
feeds its discovery."""
from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from importlib import resources

from transientvod.config import Config, ConfigError, load_config
from transientvod.head.launcher import format_summary, run_job
from transientvod.head.spot_watcher import revocation, spot_hosts_command

# The exit code of a job or fleet that stopped because its projected spend reached its budget:
# not a failure (the work is in a durable checkpoint), but not finished either.
BUDGET_STOPPED_EXIT = 4
# Shipped inside the package (configs/ of the checkout; see setup.py), so that an installed
# wheel runs the demo without a checkout.
DEMO_CONFIG = resources.files("transientvod.configs") / "demo.yaml"


def add_parser(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="the main job on the embedded digits data set")
    demo.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="override a config value (repeatable)")
    demo.set_defaults(func=cmd_demo)
    train = subparsers.add_parser("train", help="start an elastic job through horovodrun")
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
    watcher = subparsers.add_parser("watch", help="run the spot watcher that feeds the spot_hosts discovery")
    watcher.add_argument("--config", help="a YAML file with a spot: section")
    watcher.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                         help="override a config value (repeatable)")
    watcher.set_defaults(func=cmd_watch)


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
