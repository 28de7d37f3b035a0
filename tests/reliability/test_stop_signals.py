"""How a training process takes signals (nnx_ppo.runner.StopFlag): the first
Ctrl-C or SIGTERM asks for a stop with a checkpoint, a second Ctrl-C aborts,
and a repeated SIGTERM (GNU ``timeout`` signals the command and then its
process group) does not."""

import os
import signal

import pytest

from nnx_ppo.runner import StopFlag


def _signal_self(sig):
    os.kill(os.getpid(), sig)
    for _ in range(1000):  # Python runs the handler between bytecodes of the main thread
        pass


def test_sigterm_twice_still_stops_with_a_checkpoint():
    said = []
    with StopFlag(said.append) as stop:
        _signal_self(signal.SIGTERM)
        assert stop()
        try:
            _signal_self(signal.SIGTERM)
        except KeyboardInterrupt:
            pytest.fail("a second SIGTERM aborted the run without its checkpoint")
        assert stop()
    assert len(said) == 1 and said[0].startswith("stop requested")


def test_second_ctrl_c_aborts():
    with StopFlag(lambda _: None) as stop:
        _signal_self(signal.SIGINT)
        assert stop()
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)


def test_ctrl_c_after_sigterm_aborts():
    with StopFlag(lambda _: None):
        _signal_self(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)


def test_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopFlag(lambda _: None):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
