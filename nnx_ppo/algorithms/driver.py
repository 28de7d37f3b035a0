"""The driver loop: call a compiled training function until done, with hooks.

The compiled part (e.g. :func:`nnx_ppo.algorithms.ppo.make_train_fn`) is a
pure ``fn(state, n) -> (state, IterationOutput)`` running ``n`` iterations in
one call (:class:`~nnx_ppo.algorithms.ppo.IterationOutput`). :class:`Driver`
is the only Python loop: it calls it, checks the health flags
(:class:`~nnx_ppo.algorithms.ppo.Health`), and runs the hooks (log every
iteration, evaluate and checkpoint on their schedules, stop on request)
between calls. PPO and any other trainer built on the same state shape
share it. The errors a failed health check raises are defined here.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "NonFiniteError",
    "ReplayMismatchError",
    "rule_breaking_module_error",
    "Failure",
    "Hooks",
    "DriverResult",
    "Driver",
]


class NonFiniteError(FloatingPointError):
    """Raised when rewards, observations or the loss stop being finite."""


class ReplayMismatchError(RuntimeError):
    """Raised when the loss replay does not reproduce the rollout before the
    first update: a module breaks the rules of docs/custom_modules.md."""


def rule_breaking_module_error(err: BaseException, network: Any = None) -> ReplayMismatchError:
    """A :class:`ReplayMismatchError` for Flax's ``TraceContextError`` (a module
    mutated an NNX variable, e.g. drew from a class-level ``nnx.Rngs``,
    inside ``__call__`` under a JAX transform), naming the innermost
    :class:`~nnx_ppo.networks.types.StatefulModule` whose ``__call__`` was
    running and, given the ``network``, its path in it
    (``layers/1 (MyNoisyNeuron)``)."""
    from flax import nnx

    from nnx_ppo.networks.types import StatefulModule

    culprit = None
    tb = err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if tb.tb_frame.f_code.co_name == "__call__" and isinstance(owner, StatefulModule):
            culprit = type(owner)
        tb = tb.tb_next
    where = "a module"
    if culprit is not None:
        paths = []
        if network is not None:
            paths = ["/".join(str(p) for p in path) or "(the network itself)"
                     for path, module in nnx.iter_modules(network) if type(module) is culprit]
        where = (f"module {', '.join(paths)} ({culprit.__name__})" if paths else f"module {culprit.__name__}")
    return ReplayMismatchError(
        f"{where} mutates an NNX variable inside __call__ (Flax: {str(err).splitlines()[0]}). The randomness rule "
        "of docs/custom_modules.md: keep one key per env in the carry (seeded in initialize_state, split in "
        "__call__) instead of drawing from a class-level nnx.Rngs; running statistics change only in "
        "update_statistics.")


@dataclasses.dataclass(frozen=True)
class Failure:
    """Where and why one seed of a batch stopped training (its state stays
    at the last healthy iteration, ``iteration - 1``).

    Attributes:
      iteration: the iteration whose health failed (1-based, as counted by the driver).
      env_steps: env steps at the end of that iteration.
      error: the :class:`NonFiniteError` or :class:`ReplayMismatchError` it would raise alone.
    """

    iteration: int
    env_steps: int
    error: Exception


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What the driver does between compiled calls (every field optional).

    Attributes:
      log: ``log(metrics, env_steps)`` for every iteration's metrics and every evaluation.
      evaluate: ``evaluate(state, env_steps) -> metrics``; run after the first
        call, every ``eval_every_steps`` and at the end.
      eval_every_steps: env steps between evaluations.
      checkpoint: ``checkpoint(state, env_steps)``; run every
        ``checkpoint_every_steps`` and once at the end (if not just saved).
      checkpoint_every_steps: env steps between checkpoints (None: only at the end).
      should_stop: polled after every call; True ends training early.
      stop_may_lag: a stop may end training one call late (a stop on
        request, as Ctrl-C), so each call can go out before the last one's
        results are read; False: right after the call it answered True for.
    """

    log: Callable[[dict[str, float], int], None] | None = None
    evaluate: Callable[[Any, int], dict[str, float]] | None = None
    eval_every_steps: int | None = None
    checkpoint: Callable[[Any, int], None] | None = None
    checkpoint_every_steps: int | None = None
    should_stop: Callable[[], bool] | None = None
    stop_may_lag: bool = False


@dataclasses.dataclass
class DriverResult:
    """What :meth:`Driver.run` returns.

    Attributes:
      state: the last training state.
      metrics: the last iteration's metrics.
      eval_history: ``(env_steps, metrics)`` of every evaluation.
      iterations: iterations completed (counting those before the start).
      compile_seconds: wall time of the first (compiling) call.
    """

    state: Any
    metrics: dict[str, float]
    eval_history: list[tuple[int, dict[str, float]]]
    iterations: int
    compile_seconds: float


def _host_value(x: Any) -> Any:
    """A float for a scalar; a NumPy array for a metric with a seed axis."""
    return float(x) if np.ndim(x) == 0 else np.asarray(x, np.float64)


def _host_rows(output: Any, n: int) -> list[tuple[Any, dict[str, Any]]]:
    """Stacked ``[max_iterations, ...]`` outputs of one call (an
    :class:`~nnx_ppo.algorithms.ppo.IterationOutput`) to ``n`` host rows ``(health, metrics)``."""
    host = jax.device_get(output)
    rows = []
    for i in range(n):
        health = jax.tree.map(lambda x, i=i: np.asarray(x)[i], host.health)
        rows.append((health, {k: _host_value(np.asarray(v)[i]) for k, v in host.metrics.items()}))
    return rows


class Driver:
    """Run a compiled ``train_fn(state, n)`` until ``total_iterations`` are done.

    ``driver.state`` is always the latest state (also after an exception or
    an interrupt between calls), so the caller can keep what was trained.

    Every member fails alone: the compiled iteration keeps a failing member
    at its last healthy state
    (:func:`~nnx_ppo.algorithms.ppo.keep_last_healthy`), its first
    :class:`Failure` goes into ``driver.failures`` (member index -> failure)
    and the others train on; the loop ends early when every member has
    failed (one plain run: at its failure).

    Args:
      train_fn: compiled ``fn(state, n) -> (state, IterationOutput)`` with
        ``[iterations_per_call]``-stacked outputs (rows ``>= n`` unused).
      state: the state to start from (donated to ``train_fn``).
      start_iteration: iterations already done in ``state``.
      total_iterations: iterations to reach.
      iterations_per_call: the most iterations one call runs.
      steps_per_iteration: env steps per iteration (for logging and schedules).
      hooks: see :class:`Hooks`.
      member_iterations: each member's completed iterations in ``state`` (a
        member that failed before stays behind the others; default: one
        member at ``start_iteration``); failures count each member's own iterations.
      stacked: whether the state and the health have a leading member axis.
    """

    def __init__(self, train_fn: Callable, state: Any, *, start_iteration: int, total_iterations: int,
                 iterations_per_call: int, steps_per_iteration: int, hooks: Hooks = Hooks(),
                 member_iterations: list[int] | None = None, stacked: bool = False):
        self.train_fn = train_fn
        self.state = state
        self.iteration = start_iteration
        self.start_iteration = start_iteration
        self.total_iterations = total_iterations
        self.iterations_per_call = iterations_per_call
        self.steps_per_iteration = steps_per_iteration
        self.hooks = hooks
        self.member_iterations = [start_iteration] if member_iterations is None else list(member_iterations)
        self.stacked = stacked
        self.failures: dict[int, Failure] = {}

    @property
    def steps(self) -> int:
        """Env steps done so far."""
        return self.iteration * self.steps_per_iteration

    def _check(self, health: Any) -> None:
        """Note each newly failed member (``health``: one row's
        :class:`~nnx_ppo.algorithms.ppo.Health`)."""
        for index, start in enumerate(self.member_iterations):
            own = start + self.iteration - self.start_iteration  # the member's iteration, if it has not failed
            error = None if index in self.failures else health.error(own, index if self.stacked else None)
            if error is not None:
                self.failures[index] = Failure(iteration=own, env_steps=own * self.steps_per_iteration, error=error)

    @property
    def all_failed(self) -> bool:
        """Every member has failed."""
        return len(self.failures) == len(self.member_iterations)

    @property
    def state_steps(self) -> int:
        """Env steps the state holds, which names its checkpoint: the driver's,
        or once every member has failed, the latest member's last healthy iteration."""
        if not self.all_failed:
            return self.steps
        return max(f.iteration - 1 for f in self.failures.values()) * self.steps_per_iteration

    def _last_scheduled_evaluation(self) -> int | None:
        """The env step of the last evaluation a run that started from scratch
        made before ``start_iteration`` (None for a fresh run), so that a
        resumed run evaluates where the uninterrupted one does: after the first
        call, then whenever ``eval_every_steps`` have passed since the last one."""
        if self.start_iteration == 0:
            return None
        if self.hooks.eval_every_steps is None:  # only after the first call and at the end
            return self.steps
        iteration, last = 0, None
        while iteration < self.start_iteration:
            iteration += min(self.iterations_per_call, self.start_iteration - iteration)
            steps = iteration * self.steps_per_iteration
            if last is None or steps - last >= self.hooks.eval_every_steps:
                last = steps
        return last

    def _dispatch(self, start: int) -> "_Call":
        """Start the call that runs the iterations from ``start`` on (up to
        ``iterations_per_call``); ``self.state`` becomes its (future) state."""
        n = min(self.iterations_per_call, self.total_iterations - start)
        started = time.perf_counter()
        self.state, output = self.train_fn(self.state, jnp.asarray(n, jnp.int32))
        return _Call(output=output, n=n, started=started)

    def _due(self, iteration: int, last_eval: int | None, last_checkpoint: int) -> tuple[bool, bool]:
        """``(evaluate, checkpoint)``: whether each hook falls due after ``iteration``."""
        steps, hooks = iteration * self.steps_per_iteration, self.hooks
        evaluate = hooks.evaluate is not None and (last_eval is None or iteration == self.total_iterations or (
            hooks.eval_every_steps is not None and steps - last_eval >= hooks.eval_every_steps))
        checkpoint = hooks.checkpoint is not None and hooks.checkpoint_every_steps is not None and (
            steps - last_checkpoint >= hooks.checkpoint_every_steps)
        return evaluate, checkpoint

    def run(self) -> DriverResult:
        """The loop. A failure ends it only when every member has failed (see ``failures``).
        Each call goes out before the last one's results are read (the device
        does not wait for the host), unless a hook reads the state between
        them or a stop must be exact (:class:`Hooks`)."""
        hooks = self.hooks
        last_checkpoint = self.steps
        saved = {self.steps} if self.start_iteration else set()  # env steps with a checkpoint (a resume's own)
        last_eval = self._last_scheduled_evaluation()
        eval_history: list[tuple[int, dict[str, float]]] = []
        last_metrics: dict[str, float] = {}
        compile_seconds = 0.0
        tick = previous = time.perf_counter()
        call = None if self.all_failed or self.iteration >= self.total_iterations else self._dispatch(self.iteration)
        stopping = False
        while call is not None:
            after = self.iteration + call.n
            ahead = None
            if (not stopping and after < self.total_iterations and (hooks.should_stop is None or hooks.stop_may_lag)
                    and not any(self._due(after, last_eval, last_checkpoint))):
                ahead = self._dispatch(after)
            rows = _host_rows(call.output, call.n)
            now = time.perf_counter()
            elapsed = now - max(call.started, previous)  # this call's share of the wall time
            previous = now
            if self.iteration == self.start_iteration:
                compile_seconds = elapsed
            for health, row in rows:
                self.iteration += 1
                self._check(health)
                row["time/steps_per_second"] = call.n * self.steps_per_iteration / max(elapsed, 1e-9)
                row["time/elapsed_seconds"] = now - tick
                last_metrics = row
                if hooks.log is not None:
                    hooks.log(row, self.steps)
            if self.all_failed:
                if ahead is not None:  # it left every (failed) member's state as it was
                    jax.block_until_ready(ahead.output)
                break
            evaluate, checkpoint = self._due(self.iteration, last_eval, last_checkpoint)
            if evaluate:
                metrics = hooks.evaluate(self.state, self.steps)
                eval_history.append((self.steps, metrics))
                last_eval = self.steps
                if hooks.log is not None:
                    hooks.log(metrics, self.steps)
            if checkpoint:
                hooks.checkpoint(self.state, self.steps)
                last_checkpoint = self.steps
                saved.add(self.steps)
            if not stopping and hooks.should_stop is not None and hooks.should_stop():
                stopping = True
            if ahead is not None or stopping or self.iteration == self.total_iterations:
                call = ahead
            else:
                call = self._dispatch(self.iteration)
        if hooks.checkpoint is not None and self.state_steps not in saved:
            hooks.checkpoint(self.state, self.state_steps)
        return DriverResult(state=self.state, metrics=last_metrics, eval_history=eval_history,
                            iterations=self.iteration, compile_seconds=compile_seconds)


# A dispatched call: its [iterations_per_call]-stacked output, how many of its iterations count, when it went out.
_Call = collections.namedtuple("_Call", "output n started")
