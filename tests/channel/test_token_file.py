"""channel/token.py's file on one host: written with mode 0600, read by the worker, and one
sentence when a worker has none. The token's way to remote hosts, and the scan of every
command line, is tests/testbed/test_channel_token.py."""
from __future__ import annotations

import os
import secrets

import pytest

from transientvod.channel import token as channel_token
from transientvod.channel.token import TOKEN_FILE_ENV, TokenError, read_token, write_token_file


@pytest.fixture
def relative():
    name = channel_token.token_file(f"test-{secrets.token_hex(6)}")
    yield name
    (channel_token.home() / name).unlink(missing_ok=True)


def test_the_token_file_is_private_whatever_the_umask_and_the_worker_reads_it(relative):
    old = os.umask(0)  # the most permissive: the file's mode must not depend on it
    try:
        path = write_token_file(relative, "the-token")
    finally:
        os.umask(old)
    assert path == channel_token.home() / relative
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_token({TOKEN_FILE_ENV: relative}) == "the-token"
    write_token_file(relative, "a-new-token")  # a second job's write replaces it whole
    assert read_token({TOKEN_FILE_ENV: relative}) == "a-new-token"


def test_a_worker_without_the_file_is_one_sentence(relative):
    with pytest.raises(TokenError) as missing:
        read_token({TOKEN_FILE_ENV: relative})
    assert str(missing.value).startswith(f"this worker cannot read the channel's token from "
                                         f"{channel_token.home() / relative} (No such file or directory)")
    with pytest.raises(TokenError, match=f"{TOKEN_FILE_ENV} is not set"):
        read_token({})



def test_a_home_the_launcher_cannot_write_is_one_sentence(tmp_path, monkeypatch):
    locked = tmp_path / "home"
    locked.mkdir(mode=0o500)
    monkeypatch.setattr(channel_token, "home", lambda: locked)
    if os.access(locked, os.W_OK):  # root writes anywhere: a regular file in the path's way instead
        (locked / ".transientvod").write_text("not a directory")
    with pytest.raises(TokenError) as refused:
        write_token_file(channel_token.token_file("x"), "the-token")
    assert str(refused.value).startswith(f"the launcher cannot write the channel's token to {locked}/")
    assert str(refused.value).endswith("; its home directory must be writable.")
