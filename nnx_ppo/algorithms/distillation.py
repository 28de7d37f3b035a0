"""Policy distillation: a student learns to act like a frozen teacher.

Rusu et al. (2015), on the machinery PPO uses. Every iteration:

1. rollout ``[T, B]``: the student acts (or, with teacher mixing, the teacher
   with probability ``beta``); the frozen teacher runs alongside in eval mode
   on its own carry, and its actions are recorded;
2. ``n_epochs x n_minibatches`` updates: the student replays whole env
   sequences from the stored carries (exactly the activations that acted) and
   maximizes the log-likelihood of the teacher's actions;
3. ``update_statistics`` with the student's ``[T, B, ...]`` extras.

Rollout, replay, minibatching, the optimizer and PPO's initial state are
shared, and the one trainer (:func:`nnx_ppo.algorithms.trainer.train`: the
compiled program, the driver loop with evaluation, logging, checkpoints,
resume and stop, sharding) runs it; only the iteration differs. Teacher and student are any networks with a
:class:`~nnx_ppo.networks.types.PPONetworkOutput` on the same action space (or one
``target_fn`` maps the teacher's to the student's):
an MLP teacher into an LSTM student, or a privileged teacher that reads what
the student does not see (``teacher_obs``).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any, Unpack

import jax
import jax.numpy as jnp
import optax

from nnx_ppo import _original_paths
from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import NetworkFn, copy_tree
from nnx_ppo.algorithms.ppo import (
    Health,
    IterationOutput,
    TrainingState,
    Trajectory,
    check_scalar_regularization,
    collect_rollout,
    make_optimizer,
    new_training_state,
    replay_error,
    sum_leaves,
    update_epochs,
)
from nnx_ppo.algorithms.trainer import Algorithm, TrainOptions, TrainResult, evaluation_hook, train
from nnx_ppo.envs.registry import as_env
from nnx_ppo.networks.adapter import extras_for_actions
from nnx_ppo.networks.feedforward import compute_precision
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModuleOutput

__all__ = [
    "DistillationConfig",
    "TeacherStudent",
    "distillation_loss",
    "distillation_iteration",
    "train_distillation",
]


@dataclasses.dataclass(frozen=True)
class DistillationConfig:
    """What only distillation needs (batch shape, epochs, minibatches,
    learning rate and total steps come from :class:`TrainConfig.ppo`).

    Attributes:
      teacher_mixing: ``beta``, the probability that an env executes the
        teacher's action instead of the student's at a step (DAgger-style;
        0: the student always acts, the default).
      teacher_mixing_steps: env steps over which ``beta`` decays linearly from
        ``teacher_mixing`` to 0 (None: constant).
    """

    teacher_mixing: float = 0.0
    teacher_mixing_steps: int | None = None

    def __post_init__(self):
        if not 0.0 <= self.teacher_mixing <= 1.0:
            raise ValueError(f"DistillationConfig.teacher_mixing must be in [0, 1], got {self.teacher_mixing}")
        if self.teacher_mixing_steps is not None and (
                isinstance(self.teacher_mixing_steps, bool) or not isinstance(self.teacher_mixing_steps, int)
                or self.teacher_mixing_steps < 1):
            raise ValueError("DistillationConfig.teacher_mixing_steps must be a positive int or None, got "
                             f"{self.teacher_mixing_steps!r}")

    def beta(self, env_steps: jax.Array) -> jax.Array:
        """The mixing probability after ``env_steps`` training steps."""
        beta = jnp.asarray(self.teacher_mixing, jnp.float32)
        if self.teacher_mixing_steps is None:
            return beta
        return beta * jnp.clip(1.0 - env_steps / self.teacher_mixing_steps, 0.0, 1.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherStudent:
    """The network the rollout runs: student and frozen teacher side by side.

    Has :class:`NetworkFn`'s ``apply``, ``reset`` and ``fixed_resets``, so
    :func:`~nnx_ppo.algorithms.ppo.collect_rollout` runs it unchanged.
    Carry ``{"student", "teacher"}`` (plus ``"key"``, ``[B]`` keys, with
    mixing); observations are the env's, or ``{"student", "teacher"}`` when
    ``privileged``. The output is the student's :class:`PPONetworkOutput`
    with the executed actions; the extras are ``{"student": the student's
    extras, "teacher_actions": [B, ...]}`` (the targets, after ``target``).

    Attributes:
      student, teacher: the two networks' functional views (the teacher's in
        eval mode).
      beta: scalar probability of executing the teacher's action.
      privileged: observations are ``{"student", "teacher"}``.
      mixing: draw the executed action (else the student's always).
      target: ``target(one env's teacher actions) -> the student's target
        actions``, applied per env (vmapped) to the teacher's actions before
        they are recorded (and executed, with mixing); None: the teacher's
        actions themselves.
    """

    student: NetworkFn
    teacher: NetworkFn
    beta: jax.Array
    privileged: bool = dataclasses.field(default=False, metadata=dict(static=True))
    mixing: bool = dataclasses.field(default=False, metadata=dict(static=True))
    target: Callable[[Any], Any] | None = dataclasses.field(default=None, metadata=dict(static=True))

    def targets(self, teacher_actions: Any) -> Any:
        """The student's targets for the teacher's ``[B, ...]`` actions."""
        return teacher_actions if self.target is None else jax.vmap(self.target)(teacher_actions)

    def _views(self, obs: Any) -> tuple[Any, Any]:
        return (obs["student"], obs["teacher"]) if self.privileged else (obs, obs)

    def apply(self, carry: Any, obs: Any, extras: Any = None) -> tuple[StatefulModuleOutput, "TeacherStudent"]:
        """One step of both networks on ``[B, ...]`` observations."""
        del extras  # never replayed as a pair: the student replays alone
        student_obs, teacher_obs = self._views(obs)
        t_out, teacher = self.teacher.apply(carry["teacher"], teacher_obs)
        s_out, student = self.student.apply(carry["student"], student_obs)
        teacher_actions = jax.lax.stop_gradient(self.targets(t_out.output.actions))
        actions = s_out.output.actions
        next_state = {"student": s_out.next_state, "teacher": t_out.next_state}
        if self.mixing:
            keys = jax.vmap(lambda k: jax.random.split(k))(carry["key"])  # [B, 2]
            use_teacher = jax.vmap(jax.random.uniform)(keys[:, 1]) < self.beta
            pick = lambda t, s: jnp.where(jnp.reshape(use_teacher, use_teacher.shape + (1,) * (s.ndim - 1)), t, s)
            actions = jax.tree.map(pick, teacher_actions, actions)
            next_state["key"] = keys[:, 0]
        out = s_out.replace(
            next_state=next_state,
            output=s_out.output.replace(actions=actions),
            rollout_extras={"student": s_out.rollout_extras, "teacher_actions": teacher_actions},
        )
        return out, dataclasses.replace(self, student=student, teacher=teacher)

    def reset(self, carry: Any) -> tuple[Any, "TeacherStudent"]:
        """Both networks' ``reset_state`` (the mixing keys continue)."""
        student_carry, student = self.student.reset(carry["student"])
        teacher_carry, teacher = self.teacher.reset(carry["teacher"])
        fresh = {**carry, "student": student_carry, "teacher": teacher_carry}
        return fresh, dataclasses.replace(self, student=student, teacher=teacher)

    def fixed_resets(self, carry: Any) -> list[bool]:
        """:meth:`NetworkFn.fixed_resets` of both networks, per leaf of
        ``carry`` (the mixing keys are not fixed)."""
        flags = lambda view, sub: jax.tree.unflatten(jax.tree.structure(sub), view.fixed_resets(sub))
        tree = {**jax.tree.map(lambda _: False, carry), "student": flags(self.student, carry["student"]),
                "teacher": flags(self.teacher, carry["teacher"])}
        return jax.tree.leaves(tree)


def distillation_loss(params: Any, network: NetworkFn, trajectory: Trajectory,
                      unroll: int = 1) -> tuple[jax.Array, dict]:
    """Negative log-likelihood of the teacher's actions under the student.

    ``trajectory`` is a ``[T, M]`` slice of the student's rollout whose
    sampler extras score the teacher's actions (see
    :func:`~nnx_ppo.networks.adapter.extras_for_actions`); the replay runs
    from the stored carries, so the student is trained on the activations
    that acted. ``total = -mean log p(teacher action) + regularization`` (the
    student's modules' ``regularization_loss``: KL, entropy bonus, ...).
    ``unroll``: the replay's scan unroll (``PPOConfig.replay_unroll``).
    """
    check_scalar_regularization(network.with_state(params=params), trajectory)
    replay = network.with_state(params=params).replay(trajectory, unroll)
    nll = -jnp.mean(sum_leaves(replay.output.loglikelihoods))
    total = nll + replay.regularization_loss
    return total, {"loss/total": total, "loss/distillation": nll, "loss/regularization": replay.regularization_loss}


def distillation_iteration(env, graphdef: Any, teacher: NetworkFn, optimizer: optax.GradientTransformation,
                           config: PPOConfig, distillation: DistillationConfig, observe: Callable | None,
                           state: TrainingState, target: Callable[[Any], Any] | None = None,
                           ) -> tuple[TrainingState, IterationOutput]:
    """One distillation iteration (pure; the counterpart of
    :func:`nnx_ppo.algorithms.ppo.train_iteration`); ``target`` maps one
    env's teacher actions to the student's targets (see :class:`TeacherStudent`).

    1. rollout ``[T, B]`` of :class:`TeacherStudent`;
    2. the student's replay of the whole batch with its own extras must
       reproduce the rollout's log-likelihoods and values (``replay_error``);
    3. ``n_epochs x n_minibatches`` updates of :func:`distillation_loss`;
    4. the student's ``update_statistics``.
    """
    key, rollout_key, epoch_key = jax.random.split(state.key, 3)
    beta = distillation.beta(state.iteration * config.steps_per_iteration)
    pair = TeacherStudent(student=NetworkFn(graphdef, state.params, state.rest), teacher=teacher, beta=beta,
                          privileged=observe is not None, mixing=distillation.teacher_mixing > 0, target=target)
    rollout = collect_rollout(env, pair, state.rollout, rollout_key, config.rollout_length,
                              bootstrap_on_truncation=False, observe=observe)
    traj, student = rollout.trajectory, rollout.network.student
    own = dataclasses.replace(traj, obs=pair._views(traj.obs)[0], carry=traj.carry["student"],
                              start_carry=traj.start_carry["student"],
                              extras=traj.extras["student"])
    unroll = config.scan_unroll(jax.default_backend())
    error = replay_error(student.replay(own, unroll).output, traj)
    targets = dataclasses.replace(own, extras=extras_for_actions(student.module(), own.extras,
                                                                 traj.extras["teacher_actions"]))
    loss_fn = functools.partial(distillation_loss, unroll=unroll)
    student, opt_state, loss_metrics = update_epochs(student, optimizer, state.opt_state, targets, epoch_key,
                                                     config, loss_fn=loss_fn)
    student = student.update_statistics(own.extras)

    stats = rollout.stats
    metrics = {
        **loss_metrics,
        **rollout.metrics,
        "replay/max_error": error,
        "distill/teacher_mixing": beta,
        "train/reward_mean": jnp.mean(sum_leaves(traj.rewards)),
        **stats.metrics(),
    }
    health = Health.measure(stats, loss_metrics["loss/total"], error, config.replay_tolerance)
    next_state = state.next(network=student, opt_state=opt_state, rollout=rollout.state, key=key)
    return next_state, IterationOutput(health=health, metrics=metrics)


def _check_pair(env, pair: TeacherStudent, carry: Any, observe: Callable | None) -> None:
    """Named errors when the teacher's output is not a PPO network's or its
    actions differ in structure, shape or dtype from the student's."""
    state = jax.eval_shape(lambda k: jax.vmap(env.reset)(jax.random.split(k, 1)), jax.random.key(0))
    one = jax.tree.map(lambda x: x[:1], carry)
    obs = (observe or (lambda s: s.obs))(state)
    student_obs, teacher_obs = pair._views(obs)
    try:
        t_out = jax.eval_shape(lambda n, c, o: n.apply(c, o)[0], pair.teacher, one["teacher"], teacher_obs)
    except Exception as err:
        where = "teacher_obs(env_state)" if observe is not None else "the env's observations"
        raise ValueError(f"train_distillation: the teacher cannot run on {where}: {err}") from err
    if not isinstance(t_out.output, PPONetworkOutput):
        raise TypeError("train_distillation: the teacher must output a PPONetworkOutput (a network from "
                        f"nnx_ppo.networks.factories or a PPOAdapter), got {type(t_out.output).__name__}")
    s_out = jax.eval_shape(lambda n, c, o: n.apply(c, o)[0], pair.student, one["student"], student_obs)
    describe = lambda tree: jax.tree.map(lambda x: (x.shape, str(x.dtype)), tree)
    teacher_actions, what = t_out.output.actions, "teacher actions"
    if pair.target is not None:
        try:
            teacher_actions = jax.eval_shape(pair.targets, teacher_actions)
        except Exception as err:
            one_env = jax.tree.map(lambda x: (x.shape[1:], str(x.dtype)), teacher_actions)
            raise ValueError(f"train_distillation: target_fn cannot map one env's teacher actions {one_env}: "
                             f"{err}") from err
        what = "target_fn(teacher actions)"
    if describe(teacher_actions) != describe(s_out.output.actions):
        hint = ("target_fn must return the student's action structure" if pair.target is not None else
                "same action space needed, or a target_fn mapping the teacher's actions to the student's")
        raise ValueError(f"train_distillation: {what} {describe(teacher_actions)} do not match the "
                         f"student's {describe(s_out.output.actions)} ({hint})")


def train_distillation(
    env,
    teacher,
    student,
    config: TrainConfig,
    *,
    distillation: DistillationConfig = DistillationConfig(),
    teacher_obs: Callable[[Any], Any] | None = None,
    target_fn: Callable[[Any], Any] | None = None,
    stop_fn: Callable[[dict[str, float], int], bool] | None = None,
    initial_eval: bool = False,
    on_evaluation: Callable[[NetworkFn, int], None] | None = None,
    **options: Unpack[TrainOptions],
) -> TrainResult:
    """Train ``student`` to act like the frozen ``teacher``; the student is
    updated in place, the teacher is not touched.

    Args:
      env: the student's env (``reset``/``step`` API, or anything
        :func:`~nnx_ppo.envs.as_env` accepts).
      teacher: a trained network with a :class:`PPONetworkOutput` on the same
        action space (any architecture); it acts in eval mode (its
        deterministic action, e.g. the mean).
      student: the network to train (any architecture), or its name, as
        for :func:`~nnx_ppo.algorithms.trainer.train_ppo`.
      config: the same :class:`TrainConfig` as for PPO: ``ppo.n_envs``,
        ``rollout_length``, ``n_epochs``, ``n_minibatches``,
        ``learning_rate`` (and its schedule/decay), ``gradient_clipping``,
        ``weight_decay``, ``total_steps``, ``shuffle_blocks`` and
        ``replay_tolerance`` apply; the other PPO fields are ignored.
        Evaluation, checkpoints and devices work as for PPO.
      distillation: the :class:`DistillationConfig` (teacher mixing).
      teacher_obs: a privileged teacher's view: ``teacher_obs(env_state)``
        for one (un-batched) env state (e.g. ``lambda s: s.data`` for the
        full physical state); default: the env's observation.
      target_fn: the student's targets from the teacher's actions:
        ``target_fn(actions)`` for one (un-batched) env's teacher actions,
        returning actions of the student's structure, shape and dtype (e.g.
        ``lambda a: a[:2]`` to distill the first two action dims of a larger
        teacher, ``lambda a: a["arm"]`` for one entry of a dict action, or a
        transformed action such as ``lambda a: 0.5 * a``). Traced with JAX
        inside the compiled iteration. With teacher mixing, the teacher's
        executed action is ``target_fn``'s too. Default: the teacher's
        actions themselves (then teacher and student need the same action space).
      stop_fn: ``stop_fn(metrics, env_steps) -> bool``, called between
        compiled calls (every iteration, with the default
        ``TrainConfig.iterations_per_call=1``) with the latest iteration's
        metrics (plus the ``eval/...`` ones when an evaluation has just run)
        and the env steps so far; True stops training early, as
        ``should_stop`` does (the state so far is kept, saved and returned),
        e.g. ``lambda m, steps: m["loss/distillation"] < 0.1``.
      initial_eval: evaluate the student once before the first update (with
        ``config.eval``'s settings, also when periodic evaluation is
        disabled), as an evaluation at env step 0: ``log_fn(metrics, 0)``,
        ``on_evaluation(policy, 0)`` and first in the result's
        ``eval_history``, and the first row of a ``run_dir``'s
        ``metrics.jsonl``. Skipped when resuming.
      on_evaluation: as for :func:`~nnx_ppo.algorithms.trainer.train_ppo` (the
        evaluated policy is the student).
      **options: the :class:`~nnx_ppo.algorithms.trainer.TrainOptions`, as
        for ``train_ppo`` (evaluations and checkpoints are of the student).

    Returns:
      A :class:`TrainResult`; metrics ``loss/distillation`` (negative
      log-likelihood of the teacher's actions, or of ``target_fn``'s),
      ``distill/teacher_mixing``, ``replay/max_error`` and PPO's
      ``train/...`` and ``env/...``.
    """
    observe = None
    if teacher_obs is not None:
        observe = lambda env_state: {"student": env_state.obs, "teacher": jax.vmap(teacher_obs)(env_state)}
    if target_fn is not None and not callable(target_fn):
        raise TypeError(f"train_distillation: target_fn must be callable, got {target_fn!r}")
    teacher_carry, teacher_fn = copy_tree(NetworkFn.of(teacher, deterministic=True)).initialize(
        config.ppo.n_envs)
    mixing = distillation.teacher_mixing > 0
    initial_evaluation: list[tuple[int, dict[str, float]]] = []
    log_fn = options.get("log_fn")

    def initial_state(env, student, config: TrainConfig) -> TrainingState:
        """PPO's initial state of the student, its carry paired with the teacher's (and mixing keys)."""
        state = new_training_state(env, student, config)
        carry = {"student": state.rollout.carry, "teacher": teacher_carry}
        if mixing:
            carry["key"] = jax.random.split(jax.random.fold_in(jax.random.key(config.seed), 1), config.ppo.n_envs)
        pair = TeacherStudent(student=NetworkFn.of(student, deterministic=False), teacher=teacher_fn,
                              beta=jnp.zeros(()), privileged=observe is not None, mixing=mixing, target=target_fn)
        _check_pair(env, pair, carry, observe)
        if initial_eval and options.get("resume_from") is None:
            eval_env = env if options.get("eval_env") is None else as_env(options["eval_env"])
            evaluate = evaluation_hook(config, student, eval_env, None, None, on_evaluation)
            initial_evaluation.append((0, evaluate(state, 0)))  # the student's variables, before any update
        return dataclasses.replace(state, rollout=dataclasses.replace(state.rollout, carry=carry))

    def iteration(env, graphdef, ppo: PPOConfig):
        optimizer = make_optimizer(ppo)

        def one(state):
            with compute_precision(ppo.precision):
                return distillation_iteration(env, graphdef, teacher_fn, optimizer, ppo, distillation, observe,
                                              state, target_fn)

        return one

    if stop_fn is not None:
        options = {**options, **_stop_options(stop_fn, log_fn, options.get("should_stop"))}
    teacher_class = f"{type(teacher).__module__}.{type(teacher).__qualname__}"
    record = {"distillation": {"teacher": teacher_class, **dataclasses.asdict(distillation)}}
    algorithm = Algorithm(initial_state=initial_state, iteration=iteration, run_record=record,
                          first_rows=lambda: initial_evaluation)
    [result] = train(algorithm, env, config, network=student, on_evaluation=on_evaluation, **options)
    result.eval_history[:0] = initial_evaluation
    return result


def _stop_options(stop_fn: Callable[[dict[str, float], int], bool], log_fn: Callable | None,
                  should_stop: Callable[[], bool] | None) -> dict[str, Callable]:
    """``log_fn`` and ``should_stop`` options that hand ``stop_fn`` what was
    logged since its last call (the latest iteration's metrics, and an
    evaluation's) with the env steps, and stop when it, or ``should_stop``,
    says so."""
    seen: dict[str, float] = {}
    steps = [0]

    def logged(metrics: dict[str, float], env_steps: int) -> None:
        if log_fn is not None:
            log_fn(metrics, env_steps)
        seen.update(metrics)
        steps[0] = env_steps

    def stop() -> bool:
        metrics = dict(seen)
        seen.clear()
        return bool(stop_fn(metrics, steps[0])) or (should_stop is not None and bool(should_stop()))

    return {"log_fn": logged, "should_stop": stop}


# The original nnx-ppo 0.3.0's names of this module that moved or were replaced.
sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]
