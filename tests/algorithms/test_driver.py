"""The driver loop: each call goes out before the last one's results are read, unless a hook reads the state."""

import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.algorithms.ppo import Health, IterationOutput
from nnx_ppo.algorithms.trainer import Driver, Hooks


class FakeProgram:
    """``train_fn(state, n)``: the state counts iterations (``[1]``; a failure at
    ``fail_at`` leaves it as it was, as the compiled guard does). Records
    each dispatch in ``events`` as ``("call", first iteration)``."""

    def __init__(self, events, iterations_per_call=1, fail_at=None):
        self.events, self.per_call, self.fail_at = events, iterations_per_call, fail_at

    def __call__(self, state, n):
        start = int(state[0])
        self.events.append(("call", start + 1))
        rows = np.arange(start + 1, start + 1 + self.per_call)
        ok = np.array([self.fail_at is None or i < self.fail_at for i in rows])
        done = int(np.sum(ok[:int(n)]))
        health = Health(finite_obs=jnp.asarray(ok), finite_reward=jnp.asarray(ok), finite_loss=jnp.asarray(ok),
                        replay_error=jnp.zeros(self.per_call), replay_ok=jnp.asarray(ok))
        return state + done, IterationOutput(health=health, metrics={"iteration": jnp.asarray(rows, jnp.float32)})


def run(total, events, *, stop_after=None, may_lag=True, evaluate_every=None, checkpoint_every=None, fail_at=None,
        iterations_per_call=1):
    seen = {}

    def log(row, steps):
        if "iteration" in row:
            events.append(("log", int(row["iteration"])))

    def evaluate(state, steps):
        events.append(("evaluate", steps))
        seen[("evaluate", steps)] = int(state[0])
        return {}

    def checkpoint(state, steps):
        events.append(("checkpoint", steps))
        seen[("checkpoint", steps)] = int(state[0])

    hooks = Hooks(log=log, evaluate=evaluate if evaluate_every else None, eval_every_steps=evaluate_every,
                  checkpoint=checkpoint if checkpoint_every else None, checkpoint_every_steps=checkpoint_every,
                  should_stop=None if stop_after is None else (lambda: any(e == ("log", stop_after) for e in events)),
                  stop_may_lag=may_lag)
    driver = Driver(FakeProgram(events, iterations_per_call, fail_at), jnp.zeros(1, jnp.int32), start_iteration=0,
                    total_iterations=total, iterations_per_call=iterations_per_call, steps_per_iteration=1,
                    hooks=hooks)
    return driver, driver.run(), seen


def test_each_call_goes_out_before_the_last_ones_rows_are_read():
    events = []
    _, result, _ = run(4, events)
    assert events == [("call", 1), ("call", 2), ("log", 1), ("call", 3), ("log", 2), ("call", 4), ("log", 3),
                      ("log", 4)]
    assert result.iterations == 4 and int(result.state[0]) == 4


def test_a_hook_that_reads_the_state_gets_the_state_of_its_step():
    events = []
    _, result, seen = run(6, events, evaluate_every=2, checkpoint_every=3)
    assert seen == {("evaluate", 1): 1, ("evaluate", 3): 3, ("checkpoint", 3): 3, ("evaluate", 5): 5,
                    ("evaluate", 6): 6, ("checkpoint", 6): 6}
    # no call is in flight while a hook reads the state
    for i, event in enumerate(events):
        if event[0] in ("evaluate", "checkpoint"):
            calls_before = sum(e[0] == "call" for e in events[:i])
            assert calls_before == event[1], (event, events)
    assert result.iterations == 6


@pytest.mark.parametrize("may_lag, stopped_at", [(True, 3), (False, 2)])
def test_a_stop_ends_after_the_call_in_flight_only_where_it_may_lag(may_lag, stopped_at):
    events = []
    driver, result, _ = run(10, events, stop_after=2, may_lag=may_lag, checkpoint_every=100)
    assert result.iterations == stopped_at and int(result.state[0]) == stopped_at
    assert [e for e in events if e[0] == "log"] == [("log", i) for i in range(1, stopped_at + 1)]
    assert events[-1] == ("checkpoint", stopped_at)  # the final checkpoint is labelled with the state's own step
    if not may_lag:
        assert events[:4] == [("call", 1), ("log", 1), ("call", 2), ("log", 2)]


def test_a_failure_with_a_call_in_flight_keeps_the_last_healthy_state():
    events = []
    driver, result, _ = run(10, events, fail_at=3, checkpoint_every=100)
    assert 0 in driver.failures and driver.failures[0].iteration == 3
    assert int(result.state[0]) == 2 and driver.state_steps == 2
    assert events[-1] == ("checkpoint", 2)


def test_several_iterations_per_call_are_logged_in_order():
    events = []
    _, result, _ = run(7, events, iterations_per_call=3)
    assert [e[1] for e in events if e[0] == "log"] == list(range(1, 8))
    assert result.iterations == 7 and int(result.state[0]) == 7
