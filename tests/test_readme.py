"""The README is the front door: at most 250 lines, the two commands first (the ones CI runs),
"What protects your money" and what has not been run on its first screen, every link to a
file or a section that exists, and every command it shows runs as written: transientvod's
commands parse with its own parser, horovodrun's with Horovod's, the discovery script prints
hosts, the six steps' config concatenation loads as a valid config, and make targets exist.
What needs a real AWS account (aws s3 cp) is the one thing not run here."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import unicodedata
from importlib.util import find_spec
from pathlib import Path

import pytest

from conftest import REPO

README = (REPO / "README.md").read_text()
FIRST_SCREEN = 50  # lines: what a reader sees before scrolling on a laptop


def section(title: str) -> str:
    return re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M).group(1)


def bash_commands(text: str) -> list[str]:
    """Every command of the text's bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #", 1)[0].strip()
            if command:
                commands.append(" ".join(command.split()))
    return commands


def six_step_commands() -> list[str]:
    spans = re.findall(r"`([^`]+)`", section("Six steps to a real spot job on AWS"))
    return [s for s in spans if s.split()[0] in ("pip", "aws", "transientvod", "cat", "mlflow")]


ALL_COMMANDS = bash_commands(README) + six_step_commands()


def slug(heading: str) -> str:
    """Python-Markdown's toc slug (what MkDocs makes a heading's anchor)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_it_opens_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"^```bash\n(.*?)^```", README, re.S | re.M).group(1)
    assert [line.split()[:2] for line in first_block.splitlines()] == [["make", "demo"], ["make", "test"]]
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"
    before_money = README.split("## What protects your money")[0]
    assert re.search(r"`make test`: [0-9-]+ minutes", before_money) and "GB" in before_money  # the real cost, in time and disk


def test_what_protects_your_money_and_what_has_not_been_run_are_on_the_first_screen():
    lines = README.splitlines()
    assert "## What protects your money" in lines[:FIRST_SCREEN]
    not_run = lines.index("## What has not been run")
    assert not_run < FIRST_SCREEN + 10
    text = section("What has not been run")
    assert "No run against a real AWS or GCE account has been made" in text
    assert "GPUs" in text


def test_every_link_reaches_a_file_and_every_anchor_a_heading():
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", README)
    assert len(links) >= 20, links
    for target, anchor in links:
        if target.startswith("http"):
            continue
        path = REPO / target
        assert path.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{target}#{anchor}"


def test_the_docs_map_links_every_page_of_the_site():
    nav_pages = set(re.findall(r"^\s*- [^:]+: (\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M))
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", section("The docs")))
    assert nav_pages - {"index.md"} <= linked, sorted(nav_pages - {"index.md"} - linked)


def test_every_command_is_one_this_test_knows_how_to_check():
    known = ("make", "transientvod", ".venv/bin/transientvod", "horovodrun", "mlflow", ".venv/bin/mlflow",
             "TRANSIENTVOD_BUILD_CUDA=1", "pip", "aws", "cat")
    unknown = [c for c in ALL_COMMANDS if c.split()[0] not in known]
    assert not unknown, unknown
    assert len(ALL_COMMANDS) >= 15, ALL_COMMANDS


def test_make_commands_name_targets_of_the_makefile():
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    makes = [shlex.split(c) for c in ALL_COMMANDS if c.startswith("make ")] + \
            [shlex.split(m) for m in re.findall(r"`(make [^`]+)`", README)]
    assert makes
    for argv in makes:
        assert argv[1] in targets, argv
        assert all(re.fullmatch(r"[A-Z_]+=.*", a) for a in argv[2:]), argv  # variables only


def test_transientvod_commands_parse_with_its_own_parser():
    from transientvod.cli import build_parser
    commands = [c for c in ALL_COMMANDS if c.split()[0] in ("transientvod", ".venv/bin/transientvod")]
    assert {c.split()[1] for c in commands} >= {"train", "watch", "aws", "fleet", "status", "down", "compare"}
    for command in commands:
        argv = [os.path.expanduser(a) for a in shlex.split(command)[1:]]
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"transientvod's parser refuses the README's command: {command}")


def test_the_horovodrun_command_parses_and_its_discovery_script_prints_the_hosts(tmp_path, monkeypatch):
    from horovod.runner.launch import parse_args

    from transientvod.spot.hosts import HostState, HostStatus, write_host_state
    [command] = [c for c in ALL_COMMANDS if c.startswith("horovodrun ")]
    argv = shlex.split(command)
    monkeypatch.setattr(sys, "argv", argv)
    args = parse_args()
    assert (args.min_num_proc, args.max_num_proc) == (2, 8) and args.host_discovery_script
    assert args.command[:3] == ["python", "-m", "transientvod.worker.train"] and find_spec("transientvod.worker.train")
    discovery = shlex.split(args.host_discovery_script)
    assert discovery[:2] == ["python", "launch/spot_hosts.py"]
    state_file = discovery[discovery.index("--state-file") + 1]
    import time
    write_host_state(tmp_path / state_file, HostState("aws", time.time(), [HostStatus("ip-10-0-0-1", 1),
                                                                          HostStatus("ip-10-0-0-2", 4)]))
    (tmp_path / "launch").symlink_to(REPO / "launch")
    done = subprocess.run([sys.executable, *discovery[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ip-10-0-0-1:1", "ip-10-0-0-2:4"]


def test_the_six_steps_config_loads_with_the_train_steps_overrides(tmp_path):
    from transientvod.config import load_config
    from transientvod.spot.provisioning.aws_setup import config_fragment
    [cat] = [c for c in ALL_COMMANDS if c.startswith("cat ")]
    [train] = [c for c in six_step_commands() if c.startswith("transientvod train")]
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "transientvod-aws-resnet32.yaml").write_text(
        config_fragment("resnet32", "us-east-1", "https://sqs.us-east-1.amazonaws.com/123456789012/q"))
    done = subprocess.run(cat, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(train)
    config_file = tmp_path / argv[argv.index("--config") + 1]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    config = load_config(config_file, overrides)
    assert (config.spot.provider, config.spot.job_tag, config.spot.region) == ("aws", "resnet32", "us-east-1")
    assert config.checkpoint.dir.startswith("s3://") and config.cost.cloud == "aws"


def test_the_wheel_the_steps_upload_is_the_one_pip_wheel_makes():
    from transientvod.version import __version__
    wheel = f"transientvod-{__version__}-py3-none-any.whl"
    named = set(re.findall(r"transientvod-[\w.]+-py3-none-any\.whl", section("Six steps to a real spot job on AWS")))
    assert named == {wheel}


def test_the_cuda_build_command_names_the_switch_setup_py_reads():
    [build] = [c for c in ALL_COMMANDS if c.startswith("TRANSIENTVOD_BUILD_CUDA=1 ")]
    assert "pip install -e . --no-build-isolation --use-pep517" in build
    assert 'BUILD_CUDA_ENV = "TRANSIENTVOD_BUILD_CUDA"' in (REPO / "csrc" / "setup_extension.py").read_text()


@pytest.mark.slow
def test_the_mlflow_ui_command_takes_its_options():
    [ui] = [c for c in ALL_COMMANDS if "mlflow" in c.split()[0] and "--backend-store-uri" in c]
    argv = shlex.split(ui)
    mlflow = Path(sys.executable).parent / "mlflow"
    done = subprocess.run([str(mlflow), *argv[1:2], "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert done.returncode == 0, done.stderr
    for option in (a for a in argv[2:] if a.startswith("--")):
        assert option in done.stdout, option
