"""The join script `transientvod fleet` gives its instances (spot/provisioning/user_data.py): what it holds,
its size against EC2's limit, and one sentence for each bad input. The script running on a
host and that host joining a job is tests/testbed/test_fleet_join.py."""
from __future__ import annotations

import subprocess

import pytest

from transientvod.spot.provisioning.user_data import (MAX_USER_DATA_BYTES, JoinSpec, UserDataError, join_script,
                                         read_public_key, watchdog_script)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJIFiHFyUQYSvQltaNmx9WQ5R3tFyB5Ii0gMbWQtifbe alice@laptop"
WHEEL = "s3://my-bucket/wheels/horovod-0.28.1+transientvod.1a2b3c4d-cp311-cp311-linux_x86_64.whl"
PROJECT = "s3://my-bucket/wheels/transientvod-0.1.0-py3-none-any.whl"


def spec(**changes) -> JoinSpec:
    values = {"public_key": KEY, "ssh_user": "ubuntu", "venv": "/home/ubuntu/transientvod/.venv",
              "project": PROJECT, "horovod_wheel": WHEEL,
              "torch": "torch==2.13.0", "region": "us-east-1", "python_version": "3.11"}
    values.update(changes)
    return JoinSpec(**values)


def values_in_bash(script: str) -> dict[str, str]:
    """The script's settings as bash itself reads them (its quoting, not ours)."""
    head = script.split("mkdir -p", 1)[0].replace("set -euo pipefail", "")
    names = ("SSH_USER", "VENV", "PUBLIC_KEY", "PROJECT", "HOROVOD_WHEEL", "TORCH_SPEC", "REGION", "PYTHON_VERSION")
    printed = subprocess.run(["bash", "-c", head + "".join(f'printf "%s\\0" "${n}";' for n in names)],
                             capture_output=True, text=True, check=True).stdout
    return dict(zip(names, printed.split("\0")))


def test_the_script_is_valid_bash_and_carries_each_value_verbatim():
    awkward = KEY.replace("alice@laptop", "it's $(rm -rf /) `x` \"y\"")
    script = join_script(spec(public_key=awkward))
    assert script.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert values_in_bash(script) == {
        "SSH_USER": "ubuntu", "VENV": "/home/ubuntu/transientvod/.venv", "PUBLIC_KEY": awkward,
        "PROJECT": PROJECT, "HOROVOD_WHEEL": WHEEL,
        "TORCH_SPEC": "torch==2.13.0", "REGION": "us-east-1", "PYTHON_VERSION": "3.11"}


def test_the_key_is_authorized_after_the_install_and_sshd_starts_last():
    # A host that takes the launcher's key must be ready to run a worker.
    script = join_script(spec())
    install = script.index('"$PY" -m pip install -q "$WHEEL"')
    key = script.index('echo "$PUBLIC_KEY" >> "$KEYS"')
    sshd = script.index("systemctl enable --now ssh")
    assert install < key < sshd
    assert "/var/log/transientvod-join.log" in script
    # Idempotent: the key is added once, and a venv that has everything is left alone.
    assert 'grep -qxF "$PUBLIC_KEY" "$KEYS" ||' in script
    assert "'import torch, horovod.torch, transientvod'" in script


def test_the_project_is_a_wheel_from_s3_or_a_requirement_then_horovod_from_s3():
    # No git checkout anywhere: transientvod's wheel carries all the worker runs.
    script = join_script(spec())
    assert "git " not in script and "git+" not in script
    project = script.index('from_s3 "$PROJECT" "$PROJECT_WHEEL"')
    requirement = script.index('"$PY" -m pip install -q "$PROJECT"')
    horovod = script.index('from_s3 "$HOROVOD_WHEEL" "$WHEEL"')
    assert script.index('"$PY" -m pip install -q "$TORCH_SPEC"') < project < requirement < horovod
    assert values_in_bash(join_script(spec(project="transientvod==0.1.0")))["PROJECT"] == "transientvod==0.1.0"


def test_without_a_horovod_wheel_the_installed_package_builds_it():
    script = join_script(spec(horovod_wheel=""))
    assert values_in_bash(script)["HOROVOD_WHEEL"] == ""
    build = script.index('"$VENV/bin/transientvod" install-horovod')
    assert script.index('"$PY" -m pip install -q "$PROJECT_WHEEL"') < build


def test_the_script_fits_ec2s_limit_and_a_longer_one_is_one_sentence():
    assert len(join_script(spec()).encode()) < MAX_USER_DATA_BYTES // 2
    with pytest.raises(UserDataError) as error:
        join_script(spec(torch="torch==2.13.0 " + "x" * MAX_USER_DATA_BYTES))
    message = str(error.value)
    assert message.startswith("the user data is ") and message.endswith(
        f"bytes, over EC2's limit of {MAX_USER_DATA_BYTES}; shorten --project-spec or --torch-spec.")


@pytest.mark.parametrize("changes, message", [
    ({"public_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----"},
     "the SSH key given is a private key; give its public half (the .pub file), which is all a worker needs."),
    ({"public_key": KEY + "\n" + KEY}, "the SSH public key is not one line of an OpenSSH .pub file"),
    ({"public_key": "not a key"}, "the SSH public key is not one line of an OpenSSH .pub file"),
    ({"ssh_user": "Bad User"}, "the SSH user 'Bad User' is not a Linux user name"),
    ({"python_version": "3"}, "the Python version '3' must look like 3.11."),
    ({"venv": ".venv"}, "the worker venv '.venv' must be an absolute path (the launcher's venv)."),
    ({"horovod_wheel": "https://example.org/horovod.whl"},
     "the Horovod wheel 'https://example.org/horovod.whl' must be an s3://bucket/key.whl URL"),
    ({"project": "s3://my-bucket/transientvod.tar.gz"},
     "the transientvod wheel 's3://my-bucket/transientvod.tar.gz' must be an s3://bucket/key.whl URL"),
    ({"project": "git+https://example.org/transientvod.git@v0.1.0"},
     "--project-spec 'git+https://example.org/transientvod.git@v0.1.0' is a git source, but workers install "
     "transientvod as a wheel; give the s3:// URL"),
])
def test_bad_input_is_one_sentence(changes, message):
    with pytest.raises(UserDataError) as error:
        spec(**changes)
    assert str(error.value).startswith(message)
    assert str(error.value).endswith(".") and "\n" not in str(error.value)


def test_a_missing_key_file_is_named(tmp_path):
    with pytest.raises(UserDataError) as error:
        read_public_key(tmp_path / "id_ed25519.pub")
    assert str(error.value) == (f"the SSH public key {tmp_path / 'id_ed25519.pub'} does not exist; give the .pub "
                                "file of the key the launcher's ssh uses.")
    (tmp_path / "id_ed25519.pub").write_text(KEY + "\n")
    assert read_public_key(tmp_path / "id_ed25519.pub") == KEY


def embedded_watchdog(script: str) -> str:
    """The watchdog program as the script writes it on the instance (its own decoding line)."""
    start = script.index("  python3 -c ")
    end = script.index("\nTRANSIENTVOD_WATCHDOG\n", start) + len("\nTRANSIENTVOD_WATCHDOG\n")
    writer = script[start:end].replace("/run/transientvod-watchdog.py", "/dev/stdout")
    return subprocess.run(["bash", "-c", writer], capture_output=True, text=True, check=True).stdout


def test_the_watchdog_starts_first_and_is_the_packages_own_program():
    import ast

    from transientvod.spot.provisioning import watchdog

    script = join_script(spec(watchdog_minutes=2.5))
    assert "WATCHDOG_MINUTES=2.5\n" in script
    # First of all: an instance whose install fails or hangs still ends itself.
    assert script.index("setsid nohup python3 /run/transientvod-watchdog.py") < script.index("useradd")
    program = embedded_watchdog(script)
    source = ast.parse(open(watchdog.__file__).read())
    for node in ast.walk(source):  # the same program, less its docstrings
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)):
            node.body = body[1:] or [ast.Pass()]
    assert ast.dump(ast.parse(program)) == ast.dump(source)
    assert join_script(spec()) == join_script(spec())  # the same package, the same user data


def test_without_a_key_the_user_data_is_the_watchdog_alone():
    script = watchdog_script(3)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "WATCHDOG_MINUTES=3\n" in script and "setsid nohup python3 /run/transientvod-watchdog.py" in script
    assert "authorized_keys" not in script and "pip install" not in script
    compile(embedded_watchdog(script), "watchdog", "exec")


@pytest.mark.parametrize("minutes", [1, 1.5, 0, -1])
def test_watchdog_minutes_under_two_are_one_sentence(minutes):
    for make in (lambda: spec(watchdog_minutes=minutes), lambda: watchdog_script(minutes)):
        with pytest.raises(UserDataError) as error:
            make()
        assert str(error.value) == (f"the watchdog minutes are {minutes!r}; give 2 or more (--watchdog-minutes), "
                                    "since a shorter limit could end an instance whose head is alive.")
