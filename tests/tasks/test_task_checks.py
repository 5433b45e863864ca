"""A task's mistakes, through the real CLI: one sentence naming the task file and what to
change, exit 2, before horovodrun starts (the launcher tries the task first: tasks/check.py)."""
from __future__ import annotations

import textwrap

import pytest

from conftest import assert_nothing_written, assert_one_sentence, run_train

GOOD_DATA = """
import torch
from torch.utils.data import TensorDataset

def build_datasets(config):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    return TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:])
"""
GOOD_MODEL = """
def build_model(config):
    return torch.nn.Linear(4, 3)
"""
# Each case: the task file's text, and what the sentence must name besides the file.
CASES = {
    "syntax_error": ("def build_model(config)\n    return None\n", ["does not import", "SyntaxError", "line 1"]),
    "import_error": ("import no_such_module_here\n", ["does not import", "no_such_module_here", "line 1"]),
    "no_build_model": (GOOD_DATA, ["has no build_model", "define build_model(config)"]),
    "empty_training_set": (GOOD_MODEL + """
import torch
from torch.utils.data import TensorDataset
def build_datasets(config):
    return TensorDataset(torch.zeros(0, 4), torch.zeros(0)), TensorDataset(torch.zeros(4, 4), torch.zeros(4))
""", ["training set", "0 sample(s)", "cluster.max_np"]),
    "test_set_smaller_than_world": (GOOD_MODEL + """
import torch
from torch.utils.data import TensorDataset
def build_datasets(config):
    return TensorDataset(torch.zeros(8, 4), torch.zeros(8).long()), TensorDataset(torch.zeros(1, 4), torch.zeros(1).long())
""", ["test set", "1 sample(s)", "fewer than the 2 worker(s)"]),
    "loss_not_scalar": (GOOD_DATA + GOOD_MODEL + """
def loss_fn(output, target):
    return torch.nn.functional.cross_entropy(output, target, reduction="none")
""", ["loss_fn", "returned (2,)", "not a scalar", ".mean()"]),
    "not_an_optimizer": (GOOD_DATA + GOOD_MODEL + """
def build_optimizer(parameters, config):
    return [torch.optim.SGD(parameters, lr=0.1)]
""", ["build_optimizer", "returned list", "torch.optim.Optimizer"]),
    "build_model_raises": (GOOD_DATA + """
def build_model(config):
    return torch.nn.Linear(config.task_settings["features"], 3)
""", ["build_model", "KeyError", "'features'", "line 11"]),
    "not_a_module": (GOOD_DATA + """
def build_model(config):
    return "a model"
""", ["build_model", "returned str", "torch.nn.Module"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_task_is_one_sentence_naming_the_file_before_horovodrun(tmp_path, case):
    text, fragments = CASES[case]
    task = tmp_path / f"{case}.py"
    task.write_text(textwrap.dedent(text))
    done = run_train(tmp_path, {"task": task.name, "cluster": {"max_np": 2}},
                     discovery=f"{__import__('conftest').LOCAL_HOSTS} --hosts localhost:1,127.0.0.1:1")
    assert_one_sentence(done, str(task), *fragments)
    assert "starting" not in done.stdout, "horovodrun started"
    assert_nothing_written(tmp_path)


def test_a_task_file_that_does_not_exist_names_the_path_relative_to_the_config(tmp_path):
    done = run_train(tmp_path, {"task": "tasks/missing.py"})
    assert_one_sentence(done, str(tmp_path / "tasks" / "missing.py"), "does not exist", "relative to the config file")


def test_a_task_module_that_is_not_installed_says_to_install_it_or_give_a_file(tmp_path):
    done = run_train(tmp_path, {"task": "no_such_package.my_task"})
    assert_one_sentence(done, "no_such_package.my_task", "not importable", "install it on every host")
