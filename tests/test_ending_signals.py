"""ending_signals: SIGINT, SIGTERM and SIGHUP raise one EndingSignal (a KeyboardInterrupt) in
the main thread; a later one, while the ending path runs, does not cut it short."""
from __future__ import annotations

import logging
import signal
import threading

import pytest

from transientvod.ending_signals import EndingSignal, ending_signals


@pytest.fixture(autouse=True)
def sighup_at_its_default():
    """SIGHUP at its default for each test, as a login shell starts a command: under nohup (or
    a CI runner that ignores SIGHUP) pytest itself would have it ignored, and ending_signals,
    rightly, keeps an ignored SIGHUP ignored."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_each_signal_raises_one_ending_signal_that_is_a_keyboard_interrupt(signum):
    with pytest.raises(KeyboardInterrupt) as raised:
        with ending_signals():
            signal.raise_signal(signum)
    assert isinstance(raised.value, EndingSignal)
    assert raised.value.signum == signum and raised.value.name == signum.name
    assert raised.value.exit_code == 128 + signum


def test_a_second_signal_during_the_ending_is_logged_not_raised(caplog):
    cleaned_up = []
    with pytest.raises(EndingSignal) as raised:
        with ending_signals("the fleet of job j"):
            try:
                signal.raise_signal(signal.SIGTERM)
            finally:
                with caplog.at_level(logging.WARNING, logger="transientvod.ending_signals"):
                    signal.raise_signal(signal.SIGHUP)  # would end the cleanup if raised
                    signal.raise_signal(signal.SIGINT)
                cleaned_up.append(True)
    assert raised.value.signum == signal.SIGTERM
    assert cleaned_up == [True]
    assert [r.getMessage() for r in caplog.records] == [
        "the fleet of job j received SIGHUP while ending after SIGTERM; it goes on ending (its instances and "
        "processes first).",
        "the fleet of job j received SIGINT while ending after SIGTERM; it goes on ending (its instances and "
        "processes first)."]


def test_the_handlers_before_come_back_and_an_ignored_sighup_stays_ignored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command
    try:
        with ending_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
            signal.raise_signal(signal.SIGHUP)  # ignored: nothing raised
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        signal.signal(signal.SIGHUP, previous_hup)


def test_off_the_main_thread_it_changes_nothing():
    seen = []

    def run():
        with ending_signals():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=10)
    assert seen == [before]
