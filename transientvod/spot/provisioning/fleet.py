"""The study's dynamic cluster: keeps `target` EC2 spot instances alive for a training job.

Each reconcile pass lists the instances tagged ``transientvod:job=<job>`` (the tag the AWS
discovery provider lists, so every instance the fleet starts joins the job by itself), and
launches one-time spot instances until `target` of them are pending or running. An instance
that is stopping, shutting down, stopped or terminated (EC2 revoked it, or someone ended it)
no longer counts; the next pass launches its replacement. At the end, on Ctrl-C, SIGTERM or
SIGHUP, or on an error, the fleet terminates every instance of the job, the ones it found as
well as the ones it started. A fleet whose pass finds an instance of the job marked
`transientvod:ended-by` (what `transientvod down` and a launcher at its job's end tag before
they terminate, job_instances.py) launches nothing more, terminates the rest and returns: the
job was ended, from any machine.

The budget rules are billing/budget.py's. Before each launch, spent() plus an hour (the
horizon) of everything running and the new server must stay within the budget; a pass that
would break it launches nothing more and answers a "hold" action quoting the numbers. And
before each pass, `run` projects the spend to the next pass (spent() plus `poll_seconds` of
everything running): once that reaches the budget it launches nothing more, terminates every
instance of the job and returns, with `budget_stop` saying why. A budget that the job's
instances (running or ended) have spent already is refused before anything is launched.

An instance costs its type's `hourly_price` for billing.meter.billed_seconds(end -
LaunchTime) (per second, rounded up, one minute at least), where the end is now for a
pending or running instance, and for an ended one the time EC2 reports in its state
transition reason, or else the time this fleet first saw it ended. Prices are what the
caller says (spot prices move); seconds of an instance that EC2 interrupts are counted even
though EC2 may waive them, so the estimate errs on the side of spending less.

Each pass also writes the heartbeat: the tag `transientvod:heartbeat=<unix time>` on every live
instance of the job, in one CreateTags call (each instance's first comes with its launch). An
instance's watchdog (spot/watchdog.py, started by its user data) reads it from the metadata
service and shuts the instance down when it stops changing, so a head that dies without a word
(SIGKILL, a lost machine) still ends its servers: the fleet launches with
InstanceInitiatedShutdownBehavior=terminate and the instance's tags in its metadata.

A dry run calls only DescribeImages and DescribeInstances: each pass answers the actions it
would take and logs them.

IAM permissions the fleet's credentials need::

    ec2:DescribeImages, ec2:DescribeInstances, ec2:RunInstances, ec2:CreateTags,
    ec2:TerminateInstances   (and iam:CreateServiceLinkedRole once per account, for EC2 Spot)
    iam:PassRole on the workers' role, with an instance profile (and iam:GetInstanceProfile for
    the CLI to find the one `aws setup` made)
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from datetime import datetime, timezone

import botocore.exceptions

from transientvod.aws_clients import aws_client, client_error_codes
from transientvod.billing.budget import BudgetError, StopVerdict, budget_horizon_hours, spent_at_start, stop_verdict
from transientvod.billing.meter import billed_seconds
from transientvod.ending_signals import ending_signals
from transientvod.spot.providers.aws import FILTER_VALUES_PER_CALL, GONE_STATES, aws_error, describe_job_instances
from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.provisioning.fleet_launch import MISSING_IMAGE_CODES, FleetLaunching
from transientvod.spot.provisioning.fleet_spec import FleetAction, FleetSpec
from transientvod.spot.provisioning.job_instances import ended_by
from transientvod.spot.provisioning.watchdog import HEARTBEAT_TAG

log = logging.getLogger(__name__)

ALIVE_STATES = frozenset({"pending", "running"})
# EC2 lists a new instance only after a few seconds (eventual consistency); until then the
# fleet counts the instance RunInstances answered, so a quick second pass does not launch twice.
LISTING_DELAY_SECONDS = 60.0

# RunInstances can take longer to answer than a describe call; the ClientToken on each
# launch makes the factory's retries safe (EC2 starts one instance per token).
READ_TIMEOUT_SECONDS = 30

# "User initiated (2026-11-30 04:00:52 GMT)": EC2 writes GMT, moto writes UTC.
TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def transition_time(instance: dict) -> float | None:
    """The unix time EC2 gives in an instance's state transition reason, if it gives one."""
    match = TRANSITION_TIME.search(instance.get("StateTransitionReason") or "")
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def _state(instance: dict) -> str:
    return instance["State"]["Name"]


def _launched_at(instance: dict) -> float:
    return instance["LaunchTime"].timestamp()


class Fleet(FleetLaunching):
    """Keeps `spec.target` spot instances of `spec.job_tag` alive within `spec.budget`.

    `clock` gives the unix time the fleet bills up to; tests pass one they control.
    """

    def __init__(self, spec: FleetSpec, region: str | None = None, endpoint_url: str | None = None,
                 dry_run: bool = False, session=None, clock=time.time):
        self.spec = spec
        self.dry_run = dry_run
        self.horizon_hours = budget_horizon_hours()
        self._clock = clock
        # Last record of every instance of the job this fleet has seen: EC2 stops listing a
        # terminated instance after about an hour, and its cost must stay in spent().
        self._seen: dict[str, dict] = {}
        # When this fleet first saw each instance ended (or ended it itself).
        self._ended_at: dict[str, float] = {}
        # When this fleet launched each of its instances, by its own clock.
        self._launched_by_fleet: dict[str, float] = {}
        # Instances this fleet saw alive: losing one of them is what a replacement answers.
        self._seen_alive: set[str] = set()
        self._replaced: set[str] = set()
        self._image_checked = False
        self._holding = False
        # Set once `transientvod down` (or a launcher at its job's end) has marked an instance of
        # the job ended (job_instances.py): "down" or "launcher", and the instance it saw it on.
        self.ended_by: tuple[str, str] | None = None
        # Instances already ended and marked at the first pass: an earlier job's ending, which
        # EC2 keeps listing for about an hour; a new fleet of the same tag must not stop on it.
        self._old_marks: set[str] | None = None
        # Set when run() stopped because the projected spend reached the budget.
        self.budget_stop: StopVerdict | None = None
        # run() may reconcile on one thread while another asks spent().
        self._lock = threading.RLock()
        self.region = region
        with self._aws_errors("creating the EC2 client"):
            self._ec2 = aws_client("ec2", region, endpoint_url, session, read_timeout=READ_TIMEOUT_SECONDS)
        self.region = self._ec2.meta.region_name  # the region boto3 chose, for the messages

    # --- the public face -----------------------------------------------------------------------

    def reconcile(self) -> list[FleetAction]:
        """One pass: list the job's instances, then launch (or replace) up to the target
        within the budget. Answers what it did, or in a dry run what it would do."""
        with self._lock:
            self._check_image()
            now = self._clock()
            instances = self._instances(now)
            if self._job_was_ended(instances):
                return []
            alive = [i for i in instances if _state(i) in ALIVE_STATES]
            lost = sorted((i for i in instances if i["InstanceId"] in self._seen_alive
                           and i["InstanceId"] not in self._replaced and _state(i) not in ALIVE_STATES),
                          key=lambda i: self._ended_at.get(i["InstanceId"], now))
            if len(alive) > self.spec.target:
                log.info("job %s has %d instances alive, more than the target of %d; the fleet leaves them "
                         "running (it ends only what terminate_all ends).", self.spec.job_tag, len(alive),
                         self.spec.target)
            actions = []
            while len(alive) < self.spec.target:
                replaced = lost.pop(0) if lost else None
                action = self._launch_one(instances, now, replaced, len(alive))
                if action is None:
                    break
                actions.append(action)
                if action.kind == "hold":
                    break
                alive.append(instances[-1])
            if not any(a.kind == "hold" for a in actions):
                self._holding = False
            launched = {a.instance_id for a in actions}
            self._write_heartbeat([i["InstanceId"] for i in alive if i["InstanceId"] not in launched])
            return actions

    def spent(self) -> float:
        """Dollars so far, billed per second (one minute at least) from each instance's
        LaunchTime until now, or until it ended; instances the fleet found count too."""
        with self._lock:
            now = self._clock()
            return self._spent(self._instances(now), now)

    def committed_rate(self) -> float:
        """Dollars per hour of the job's instances pending or running now."""
        with self._lock:
            return self._committed_rate(self._instances(self._clock()))

    def budget_verdict(self, lead_seconds: float) -> StopVerdict:
        """billing.budget.stop_verdict of the job now: spent() plus `lead_seconds` of the
        instances pending or running, against the budget (never a stop without one)."""
        with self._lock:
            now = self._clock()
            instances = self._instances(now)
            return stop_verdict(self._spent(instances, now), self._committed_rate(instances), lead_seconds,
                                self.spec.budget)

    def check_budget_left(self) -> None:
        """BudgetError, before anything is launched, when the job's instances found (running or
        ended) have cost the budget already."""
        with self._lock:
            now = self._clock()
            instances = self._instances(now)
            spent = self._spent(instances, now)
            if not spent_at_start(spent, self.spec.budget):
                return
            running = sum(1 for i in instances if _state(i) in ALIVE_STATES)
            raise BudgetError(f"job {self.spec.job_tag} has cost ${spent:.2f} already ({len(instances)} instances "
                              f"found, {running} of them pending or running), which is its budget of "
                              f"${self.spec.budget:.2f} or more; the fleet launched nothing: give a larger --budget.")

    def terminate_all(self) -> list[FleetAction]:
        """Terminates every instance of the job that has not ended (in a dry run, only says so)."""
        with self._lock:
            now = self._clock()
            ending = [i for i in self._instances(now) if _state(i) not in ("shutting-down", "terminated")]
            ids = [i["InstanceId"] for i in ending]
            prefix = "dry run: would terminate" if self.dry_run else "terminating"
            if ids:
                log.info("%s %d instances of job %s: %s.", prefix, len(ids), self.spec.job_tag, ", ".join(ids))
            if not self.dry_run:
                for start in range(0, len(ids), FILTER_VALUES_PER_CALL):
                    with self._aws_errors("ec2:TerminateInstances"):
                        self._ec2.terminate_instances(InstanceIds=ids[start:start + FILTER_VALUES_PER_CALL])
                for instance in ending:
                    self._ended_at.setdefault(instance["InstanceId"], now)
                    self._seen[instance["InstanceId"]] = {**instance, "State": {"Code": 32, "Name": "shutting-down"}}
            return [FleetAction("terminate", i.get("InstanceType"), i["InstanceId"],
                                f"the fleet of job {self.spec.job_tag} is ending ({_state(i)} instance)")
                    for i in ending]

    def run(self, poll_seconds: float = 30.0, stop: threading.Event | None = None, until=None) -> None:
        """Reconciles every `poll_seconds` until `stop` is set, `until()` answers True, the job
        was ended (`ended_by`) or the projected spend to the next pass reaches the budget (then
        `budget_stop` says so), then terminates every instance of the job; also when interrupted
        (Ctrl-C, and on the main thread SIGTERM and SIGHUP: ending_signals.EndingSignal) or
        failing. A budget spent already is BudgetError, and nothing is launched or terminated."""
        if not poll_seconds > 0:
            raise ValueError(f"poll_seconds is {poll_seconds!r}; it must be a positive number of seconds.")
        stop = stop or threading.Event()
        self.check_budget_left()
        # SIGTERM and SIGHUP (kill, systemd, a closing SSH session) take Ctrl-C's path: without
        # this, Python ends the process without running the finally below.
        with ending_signals(f"the fleet of job {self.spec.job_tag}"):
            try:
                reconciled_once = False
                while not stop.is_set():
                    try:
                        verdict = self.budget_verdict(poll_seconds)
                        if verdict.stop:
                            self.budget_stop = verdict
                            log.warning("job %s: projected spend $%.2f (spent $%.2f + $%.2f/h running for the next "
                                        "%g s) reached the budget of $%.2f; terminating every instance.",
                                        self.spec.job_tag, verdict.projected_usd, verdict.spent_usd,
                                        verdict.running_usd_per_hour, verdict.lead_seconds, verdict.budget_usd)
                            break
                        self.reconcile()
                    except ProviderError as e:
                        # A first pass that fails is a setup to fix; a later one is the network or
                        # the cloud, and the next pass tries again.
                        if not reconciled_once:
                            raise
                        log.warning("fleet of job %s could not reconcile (%s); trying again in %g s.",
                                    self.spec.job_tag, e, poll_seconds)
                    reconciled_once = True
                    if self.ended_by is not None:
                        log.info("job %s was ended by %s (instance %s is marked so); the fleet stops and "
                                 "terminates the rest.", self.spec.job_tag, *self.ended_by)
                        break
                    if until is not None and until():
                        break
                    stop.wait(poll_seconds)
            finally:
                try:
                    self.terminate_all()
                except ProviderError:
                    left = sorted(i for i, r in self._seen.items() if _state(r) not in GONE_STATES)
                    log.error("could not terminate the instances of job %s; end them by hand: "
                              "aws ec2 terminate-instances --instance-ids %s", self.spec.job_tag, " ".join(left))
                    raise

    # --- the heartbeat --------------------------------------------------------------------------

    def _write_heartbeat(self, instance_ids: list[str]) -> None:
        """The heartbeat tag, now, on these instances (the ones launched this pass got theirs at
        launch). A failure is a warning: the watchdogs wait minutes, and the next pass writes again."""
        if self.dry_run or not instance_ids:
            return
        tags = [{"Key": HEARTBEAT_TAG, "Value": str(int(self._clock()))}]
        for start in range(0, len(instance_ids), FILTER_VALUES_PER_CALL):
            try:
                with self._aws_errors("ec2:CreateTags"):
                    self._ec2.create_tags(Resources=instance_ids[start:start + FILTER_VALUES_PER_CALL], Tags=tags)
            except ProviderError as e:
                log.warning("could not write the heartbeat of job %s (%s); the next pass tries again.",
                            self.spec.job_tag, e)

    # --- what the job has -----------------------------------------------------------------------

    def _instances(self, now: float) -> list[dict]:
        """Every instance of the job this fleet knows of, as of now: what EC2 lists, what it
        launched and EC2 does not list yet, and what EC2 listed once and has forgotten since."""
        with self._aws_errors("ec2:DescribeInstances"):
            listed = {i["InstanceId"]: i
                      for i in describe_job_instances(self._ec2, self.spec.tag_key, self.spec.job_tag)}
        # A type without a price fails when the fleet bills it, never as a silent zero, but
        # not here: terminate_all must still end such an instance.
        self._seen.update(listed)
        for instance_id, instance in self._seen.items():
            if instance_id in listed or _state(instance) not in ALIVE_STATES:
                continue
            launched = self._launched_by_fleet.get(instance_id)
            if launched is None or now - launched > LISTING_DELAY_SECONDS:
                # EC2 forgot an instance the fleet last saw alive: it ended, unseen, in between.
                self._seen[instance_id] = {**instance, "State": {"Code": 48, "Name": "terminated"}}
        for instance_id, instance in self._seen.items():
            if _state(instance) in ALIVE_STATES:
                self._seen_alive.add(instance_id)
            elif instance_id not in self._ended_at:
                self._ended_at[instance_id] = now
                if instance_id in self._seen_alive:
                    log.warning("instance %s (%s) of job %s is %s (%s).", instance_id, instance.get("InstanceType"),
                                self.spec.job_tag, _state(instance), self._why_ended(instance))
        return list(self._seen.values())

    def _job_was_ended(self, instances: list[dict]) -> bool:
        """Whether an instance of the job carries the ended-by mark of a `down` (or of a
        launcher at its job's end) made since this fleet's first pass, or made on an instance
        still alive then (an ending under way); records who in `ended_by`."""
        if self.ended_by is not None:
            return True
        marked = {i["InstanceId"]: (ended_by(i), _state(i)) for i in instances if ended_by(i)}
        if self._old_marks is None:
            self._old_marks = {iid for iid, (_, state) in marked.items() if state not in ALIVE_STATES}
        fresh = sorted(iid for iid in marked if iid not in self._old_marks)
        if fresh:
            self.ended_by = (marked[fresh[0]][0], fresh[0])
        return self.ended_by is not None

    def _price(self, instance: dict) -> float:
        instance_type = instance.get("InstanceType")
        price = self.spec.hourly_price.get(instance_type)
        if price is None:
            raise ValueError(f"instance {instance['InstanceId']} of job {self.spec.job_tag} is a {instance_type}, "
                             "which hourly_price does not price; add its $/hour to the fleet spec.")
        return price

    def _spent(self, instances: list[dict], now: float) -> float:
        dollars = 0.0
        for instance in instances:
            if _state(instance) in ALIVE_STATES:
                ended_at = now
            else:
                ended_at = transition_time(instance) or self._ended_at.get(instance["InstanceId"], now)
            dollars += billed_seconds(ended_at - _launched_at(instance)) / 3600.0 * self._price(instance)
        return dollars

    def _committed_rate(self, instances: list[dict]) -> float:
        return sum(self._price(i) for i in instances if _state(i) in ALIVE_STATES)

    @staticmethod
    def _why_ended(instance: dict) -> str:
        return ((instance.get("StateReason") or {}).get("Code") or instance.get("StateTransitionReason")
                or "no reason given")

    @contextlib.contextmanager
    def _aws_errors(self, call: str, let_through: frozenset = frozenset()):
        """Turns botocore's exceptions during `call` into a one-sentence ProviderError (the
        AWS provider's wording, plus a missing image); a ClientError whose code is in
        `let_through` stays as it is, for the caller to handle."""
        try:
            yield
        except botocore.exceptions.ClientError as e:
            codes = client_error_codes(e)
            if codes & let_through:
                raise
            if codes & MISSING_IMAGE_CODES:
                raise self._missing_image_error() from e
            raise aws_error(e, call, self.region, "the fleet's") from e
        except botocore.exceptions.BotoCoreError as e:
            raise aws_error(e, call, self.region, "the fleet's") from e
