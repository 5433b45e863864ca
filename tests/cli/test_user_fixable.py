"""The CLI names the user-fixable error classes instead of importing them (cli/__init__.py):
a class renamed or moved would turn its one sentence back into a traceback, so each name is
checked against the class it names."""
from __future__ import annotations

import importlib

import pytest

from transientvod.cli import USER_FIXABLE, user_fixable


@pytest.mark.parametrize("name", sorted(USER_FIXABLE))
def test_each_name_is_an_exception_class_at_that_path(name):
    module, _, cls_name = name.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    assert issubclass(cls, Exception)
    assert user_fixable(cls("what to fix"))


def test_a_subclass_is_user_fixable_and_a_bug_is_not():
    from transientvod.tracking.compare import CompareError
    assert user_fixable(CompareError("no such run"))
    assert not user_fixable(KeyError("a bug"))
    assert not user_fixable(ValueError("a bug"))  # PlanError's and DataError's base is not enough
