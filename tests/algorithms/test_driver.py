"""The driver loop: each call goes out before the last one's results are read, unless a hook reads the state."""

import contextlib

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


@contextlib.contextmanager
def compile_events(thread=None):
    """A list of ``(kind, program)`` for each program traced (``"trace"``),
    lowered (``"lower"``) or compiled for a backend (``"compile"``) inside
    the ``with``, in the order they finished, on any thread or only on
    ``thread``; ``program``: the function's name (``"run"`` for ``jit(run)``)."""
    import threading

    import jax
    from jax._src import dispatch

    kinds = {dispatch.JAXPR_TRACE_EVENT: "trace", dispatch.JAXPR_TO_MLIR_MODULE_EVENT: "lower",
             dispatch.BACKEND_COMPILE_EVENT: "compile"}
    events = []

    def listener(event, duration, **kwargs):
        if event in kinds and (thread is None or threading.current_thread() is thread):
            events.append((kinds[event], str(kwargs.get("fun_name")).removeprefix("jit(").removesuffix(")")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@contextlib.contextmanager
def backend_compiles():
    """A list of the programs (their names) compiled for a backend inside the
    ``with`` by this thread (not one compiling beside it, whose compile may
    end while this one waits for it)."""
    import threading

    compiled = []
    with compile_events(threading.current_thread()) as events:
        try:
            yield compiled
        finally:
            compiled.extend(name for kind, name in events if kind == "compile")


def counting_evaluations(made, calls: list):
    """An ``evaluation_hook`` like ``made`` whose hooks append ``(env steps,
    programs compiled during the evaluation)`` to ``calls`` (also used by
    test_sharding.py's 4-device script)."""

    def counting_hook(*args, **kwargs):
        hook = made(*args, **kwargs)

        def counted(state, steps):
            with backend_compiles() as compiles:
                metrics = hook(state, steps)
            calls.append((steps, compiles))
            return metrics

        return counted

    return counting_hook


def test_a_program_compiled_in_the_background_is_not_compiled_again():
    import jax

    from nnx_ppo.algorithms.trainer import compile_in_background

    fn = jax.jit(lambda x, y: jnp.tanh(x @ y).sum() + 0.25)
    x, y = jnp.ones((8, 5)), jnp.ones((5, 3))
    compiling = compile_in_background(fn, x, y)
    x.delete()  # (only the shapes and placements were read: as when the state is donated right after)
    program = compiling.result()
    same, other = jnp.ones((8, 5)), jnp.ones((9, 5))
    with backend_compiles() as compiles:
        assert float(program(same, y)) == pytest.approx(8 * 3 * np.tanh(5.0) + 0.25)
    assert compiles == []
    with pytest.raises(TypeError):
        program(other, y)  # (other shapes: the evaluation hook then calls fn, which compiles for them)
    assert compile_in_background(fn, jnp.ones((8, 4)), y).result() is None  # a compile that fails: left to fn(...)


def test_the_training_program_is_lowered_before_the_evaluation_traces_beside_it(monkeypatch):
    """On an accelerator the training program is traced and lowered before
    the evaluation's program starts tracing on its thread (tracing holds
    Python's lock, XLA's compile does not), and it is still traced, lowered
    and compiled once."""
    from flax import nnx

    from nnx_ppo.algorithms import trainer
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from tests.algorithms.toy_envs import Target

    monkeypatch.setattr(trainer, "compiles_beside_training", lambda: True)  # as on an accelerator
    config = TrainConfig(ppo=PPOConfig(n_envs=6, rollout_length=5, total_steps=60, n_minibatches=2),
                         eval=EvalConfig(every_steps=30, n_envs=5, max_episode_length=6))
    with compile_events() as all_events:
        trainer.train_ppo(Target(), make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0)), config)
    events = [(kind, name) for kind, name in all_events if name in ("run", "one")]
    assert [kind for kind, name in events if name == "run"] == ["trace", "lower", "compile"], events
    assert events.index(("lower", "run")) < events.index(("trace", "one")), events
    assert ("compile", "one") in events


def test_the_training_program_compiles_ahead_of_the_initial_state_and_trains_as_compiled_at_its_call(monkeypatch):
    """On an accelerator with one device the training program compiles on a
    thread from the initial state's shapes while that state is built; the
    run calls that program (``run`` traced, lowered and compiled once) and
    trains exactly as the program compiled at its first call does."""
    import jax
    from flax import nnx

    from nnx_ppo.algorithms import trainer
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from tests.algorithms.toy_envs import Target

    config = TrainConfig(ppo=PPOConfig(n_envs=6, rollout_length=5, total_steps=90, n_minibatches=2),
                         eval=EvalConfig(enabled=False))

    def trained(beside: bool):
        monkeypatch.setattr(trainer, "compiles_beside_training", lambda: beside)
        net, rows = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0)), []
        with compile_events() as events:
            trainer.train_ppo(Target(), net, config, log_fn=lambda m, s: rows.append(
                {k: v for k, v in m.items() if not k.startswith("time/")}))
        return rows, jax.tree.leaves(nnx.state(net, nnx.Param)), [kind for kind, name in events if name == "run"]

    rows, params, run_events = trained(True)
    rows_at_call, params_at_call, _ = trained(False)
    assert run_events == ["trace", "lower", "compile"], run_events
    assert len(rows) == 3 and rows == rows_at_call
    for a, b in zip(params, params_at_call, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_program_compiled_ahead_gives_way_to_the_plain_one_when_it_fails_or_refuses_the_state():
    import concurrent.futures

    from nnx_ppo.algorithms.trainer import program_or

    def ready(value):
        future = concurrent.futures.Future()
        future.set_result(value)
        return future

    calls = []
    plain = lambda state, n: calls.append(("plain", state)) or state  # noqa: E731

    def refusing(state, n):
        calls.append(("ahead", state))
        raise TypeError("other shapes")

    accepting = lambda state, n: calls.append(("ahead", state)) or state  # noqa: E731
    for ahead, expected in ((None, ["plain", "plain"]), (refusing, ["ahead", "plain", "plain"]),
                            (accepting, ["ahead", "ahead"])):
        calls.clear()
        call = program_or(ready(ahead), plain)
        assert call(1, 1) == 1 and call(2, 1) == 2
        assert [who for who, _ in calls] == expected, (ahead, calls)


@pytest.mark.parametrize("seeds", [None, [3, 5]])
def test_the_first_evaluation_of_a_run_finds_its_program_compiled(monkeypatch, seeds):
    """On an accelerator the evaluation's program compiles beside the training
    program's; the first evaluation (after the first call) compiles nothing:
    one run, and a seed batch (its state placed for the batch)."""
    import jax
    from flax import nnx

    from nnx_ppo.algorithms import trainer
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.population import train_seeds
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from tests.algorithms.toy_envs import Target

    calls = []
    monkeypatch.setattr(trainer, "evaluation_hook", counting_evaluations(trainer.evaluation_hook, calls))
    assert trainer.compiles_beside_training() == (jax.default_backend() != "cpu")
    monkeypatch.setattr(trainer, "compiles_beside_training", lambda: True)  # as on an accelerator
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, total_steps=64, n_minibatches=2),
                         eval=EvalConfig(every_steps=32, n_envs=3, max_episode_length=7))
    make_network = lambda rngs: make_mlp_actor_critic(3, 2, (8,), (8,), rngs)  # noqa: E731
    if seeds is None:
        trainer.train_ppo(Target(), make_network(nnx.Rngs(0)), config)
    else:
        train_seeds(Target(), make_network, config, seeds)
    assert [steps for steps, _ in calls] == [32, 64]
    assert all(compiled == [] for _, compiled in calls), calls
