"""What `transientvod fleet` gives its instances so that they join the job: the user data made
from --ssh-public-key (and its options) and the instance profile `aws setup` made, against a
moto server on 127.0.0.1. The script itself is test_user_data.py; a host running it and joining
a job is tests/testbed/test_fleet_join.py."""
from __future__ import annotations

import base64
import getpass
import subprocess
import sys

import pytest

from conftest import REPO, TRANSIENTVOD, reset_moto
from test_user_data import KEY, values_in_bash

from transientvod.cli.fleet import launcher_torch
from transientvod.spot.provisioning.aws_setup import AwsSetup, setup_instance_profile, setup_security_group
from transientvod.spot.provisioning.fleet import Fleet
from transientvod.spot.provisioning.fleet_spec import FleetSpec
from transientvod.spot.provisioning.user_data import JoinSpec, join_script, watchdog_script

JOB = "join-job"
REGION = "us-east-1"
PROFILE = f"transientvod-{JOB}-worker"


@pytest.fixture
def aws(ec2_moto):
    url, ami, session = ec2_moto
    reset_moto(url)
    return url, ami, session


@pytest.fixture
def public_key(tmp_path):
    path = tmp_path / "id_ed25519.pub"
    path.write_text(KEY + "\n")
    return path


def fleet_cli(url: str, ami: str, *extra: str) -> subprocess.CompletedProcess:
    argv = TRANSIENTVOD + ["fleet", "--job-tag", JOB, "--instance-types", "g4dn.xlarge", "--target", "1",
                           "--image-id", ami, "--price", "g4dn.xlarge=0.2", "--region", REGION,
                           "--endpoint-url", url, "--budget", "5", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_print_user_data_writes_the_join_script_for_this_launcher_and_calls_no_aws(public_key):
    # Nothing listens on port 9: any AWS call would fail.
    done = fleet_cli("http://127.0.0.1:9", "ami-12345678", "--ssh-public-key", str(public_key),
                     "--print-user-data")
    assert done.returncode == 0, done.stderr
    values = values_in_bash(done.stdout)
    assert values["PUBLIC_KEY"] == KEY
    # horovodrun runs the launcher's own python path on every host: the venv goes there.
    assert values["VENV"] == sys.prefix
    assert values["SSH_USER"] == getpass.getuser()
    assert values["PYTHON_VERSION"] == f"{sys.version_info[0]}.{sys.version_info[1]}"  # the wheel's ABI
    assert values["HOROVOD_WHEEL"] == "" and values["PROJECT"] == ""


def test_a_dry_run_says_what_each_instance_gets(aws, public_key):
    url, ami, session = aws
    done = fleet_cli(url, ami, "--ssh-public-key", str(public_key), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert (f"transientvod fleet: no instance profile {PROFILE} (transientvod aws setup makes it); the "
            "instances get no AWS credentials of their own.") in done.stdout
    size = len(join_script(JoinSpec(public_key=KEY, ssh_user=getpass.getuser(), venv=sys.prefix,
                                    torch=launcher_torch(), region=REGION)).encode())
    assert (f"transientvod fleet: each instance gets {size} bytes of user data (the join script; "
            "--print-user-data shows it) and no instance profile.") in done.stdout

    assert (f"transientvod fleet: no security group transientvod-{JOB}-hosts (transientvod aws setup makes it); "
            "the instances get the VPC's default group") in done.stdout

    AwsSetup(JOB, REGION, endpoint_url=url, session=session, say=lambda line: None).setup()
    group = setup_security_group(JOB, REGION, url, session)
    assert group and group.startswith("sg-")
    done = fleet_cli(url, ami, "--ssh-public-key", str(public_key), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"and instance profile {PROFILE} and security group {group}." in done.stdout
    done = fleet_cli(url, ami, "--ssh-public-key", str(public_key), "--instance-profile", "none", "--dry-run")
    assert f"and no instance profile and security group {group}." in done.stdout
    done = fleet_cli(url, ami, "--ssh-public-key", str(public_key), "--security-group-id", "sg-0own", "--dry-run")
    assert f"and instance profile {PROFILE} and security group sg-0own." in done.stdout


@pytest.mark.parametrize("extra, named", [
    (["--horovod-wheel", "s3://b/horovod.whl"], "--horovod-wheel"),
    (["--project-spec", "s3://b/transientvod-0.1.0-py3-none-any.whl"], "--project-spec"),
    (["--horovod-wheel", "s3://b/horovod.whl", "--project-spec", "s3://b/transientvod-0.1.0-py3-none-any.whl"],
     "--horovod-wheel and --project-spec"),
])
def test_a_wheel_from_s3_without_an_instance_profile_is_one_sentence(aws, public_key, extra, named):
    url, ami, _ = aws
    done = fleet_cli(url, ami, "--ssh-public-key", str(public_key), *extra, "--dry-run")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"transientvod: the workers read {named} from S3 with an instance profile's credentials, and job {JOB} "
        f"has none; run 'transientvod aws setup --job-tag {JOB}' or give --instance-profile NAME.")


@pytest.mark.parametrize("extra, message", [
    (["--horovod-wheel", "s3://b/horovod.whl"],
     "--horovod-wheel and --project-spec go into the user data, which needs the launcher's key; give "
     "--ssh-public-key too."),
    (["--print-user-data"], "--print-user-data prints the join script, which needs --ssh-public-key."),
    (["--ssh-public-key", "/nonexistent/id.pub"],
     "the SSH public key /nonexistent/id.pub does not exist; give the .pub file of the key the launcher's ssh uses."),
])
def test_join_options_without_what_they_need_are_one_sentence(extra, message):
    done = fleet_cli("http://127.0.0.1:9", "ami-12345678", *extra)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"transientvod: {message}"


def test_launched_instances_carry_the_user_data_the_setup_instance_profile_and_security_group(aws):
    url, ami, session = aws
    assert setup_instance_profile(JOB, REGION, url, session) is None
    AwsSetup(JOB, REGION, endpoint_url=url, session=session, say=lambda line: None).setup()
    assert setup_instance_profile(JOB, REGION, url, session) == PROFILE
    script = join_script(JoinSpec(public_key=KEY, ssh_user="ubuntu", venv="/opt/venv", region=REGION))
    group = setup_security_group(JOB, REGION, url, session)
    spec = FleetSpec(job_tag=JOB, instance_types=["g4dn.xlarge"], target=1, image_id=ami,
                     hourly_price={"g4dn.xlarge": 0.2}, user_data=script, instance_profile=PROFILE,
                     security_group_ids=[group])
    [action] = Fleet(spec, region=REGION, endpoint_url=url, session=session).reconcile()
    ec2 = session.client("ec2", endpoint_url=url, region_name=REGION)
    instance = ec2.describe_instances(InstanceIds=[action.instance_id])["Reservations"][0]["Instances"][0]
    assert instance["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{PROFILE}")
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [group]
    user_data = ec2.describe_instance_attribute(InstanceId=action.instance_id, Attribute="userData")["UserData"]
    assert base64.b64decode(user_data["Value"]).decode() == script


@pytest.mark.parametrize("extra, message", [
    (["--watchdog-minutes", "1.5"],
     "the watchdog minutes are 1.5; give 2 or more (--watchdog-minutes), since a shorter limit could end an "
     "instance whose head is alive."),
    (["--watchdog-minutes", "2", "--poll-seconds", "60"],
     "--watchdog-minutes 2 is shorter than 3 of the fleet's passes (--poll-seconds 60), which write the heartbeat; "
     "give more minutes or fewer seconds."),
])
def test_a_watchdog_that_could_end_a_live_heads_instances_is_one_sentence(public_key, extra, message):
    for key in ([], ["--ssh-public-key", str(public_key)]):  # with the join script, and the watchdog alone
        done = fleet_cli("http://127.0.0.1:9", "ami-12345678", *key, *extra, "--dry-run")
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [f"transientvod: {message}"]


def test_without_a_key_each_instance_still_gets_the_watchdog(aws):
    url, ami, _ = aws
    done = fleet_cli(url, ami, "--instance-profile", "none", "--watchdog-minutes", "4", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert ("transientvod fleet: no --ssh-public-key, so the user data only starts the watchdog: the image itself "
            "must run sshd with the launcher's key and have torch, Horovod and transientvod.") in done.stdout
    size = len(watchdog_script(4).encode())
    assert (f"transientvod fleet: each instance gets {size} bytes of user data (the watchdog) and no instance "
            "profile.") in done.stdout
