"""Many members in one compiled program: seeds, sweeps and PBT.

:func:`train_seeds` trains one config over several seeds, and
:func:`train_population` every (config, seed) pair, a *member*: one network
and one training state per member, stacked on a leading axis ``[N, ...]``
(parameters, optimizer state, env states, carries, keys), the PPO iteration
run over it (vmapped, or in turn with ``TrainConfig.seed_batching="map"``,
see :func:`~nnx_ppo.algorithms.program.over_seeds`) on the one trainer
(:func:`nnx_ppo.algorithms.trainer.train`), as
:func:`~nnx_ppo.algorithms.ppo.train_ppo` trains one. One compile serves
every member. On several devices the batch is sharded like one seed's
training (by env), or by member (``TrainConfig.shard_seeds``), see
:mod:`nnx_ppo.algorithms.distributed`; with both, each device runs its own
members, which is how several CPU devices (one per core) train many seeds
fastest.

The members' configs may differ only in the numbers of
:data:`~nnx_ppo.algorithms._hyperparameters.PER_MEMBER` (learning rate, clip
range, discount, GAE lambda, critic weight, regularization (entropy) weight,
reward scale, gradient-clip norm, value clip range, target KL); each member
carries its own in its state.

*Population-based training* (:class:`PBTConfig`): after every iteration of
a population :func:`population_step` folds each member's training episode
return into its running ``score``; every ``PBTConfig.every_iterations``
iterations the worst ``fraction`` of the members (by score) each take over
the whole training state of a member drawn from the best ``fraction``
(parameters, optimizer state, env states and network carries, return
statistics, score), keep their own PRNG key, and perturb the copied
hyperparameters (*exploit and explore*, Jaderberg et al. 2017). All of it
runs on device, between two iterations of the same ``fori_loop``; the draws
come from ``PBTConfig.seed`` and the iteration, so a resumed population
repeats them. A member whose iteration failed (non-finite values: the
trainer keeps it at its last healthy state, and it fails the same way every
iteration) scores nothing from it, ranks below every other member and is
never copied: PBT replaces it first, *reviving* it from a healthy member.
The trainer still counts it as failed and logs only that lineage
(:func:`failed_member_row`). Every member's iteration metrics gain
``population/score``, ``population/parent`` (the member it last took over),
``population/took_over`` (the member whose state it took over in this
iteration, -1 if none) and ``hyperparameters/<field>``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Unpack

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.algorithms._hyperparameters import PER_MEMBER, check_population
from nnx_ppo.algorithms.config import TrainConfig, _require_positive_int, check_seeds, per_member_bounds
from nnx_ppo.algorithms.ppo import IterationOutput, TrainingState
from nnx_ppo.algorithms.trainer import PPO, TrainOptions, TrainResult, train

__all__ = ["population_members", "train_population", "train_seeds", "PBTConfig", "BOUNDS"]


@dataclasses.dataclass(frozen=True)
class Member:
    """One member of a population: which config (its index in ``configs``),
    which seed, and the config it trains with (``seed`` set)."""

    index: int
    config_index: int
    seed: int
    config: TrainConfig


def population_members(configs: Sequence[TrainConfig], seeds: Sequence[int]) -> list[Member]:
    """Every (config, seed) pair, config-major: member ``i * len(seeds) + j``
    trains ``configs[i]`` with ``seeds[j]``.

    Raises:
      PopulationConfigError: the configs differ in a field that changes the
        program (see :func:`~nnx_ppo.algorithms._hyperparameters.check_population`).
      ValueError: no config or no seed, or a seed repeated.
    """
    configs, seeds = list(configs), check_seeds(seeds, "train_population: seeds")
    check_population(configs)
    return [Member(index=i * len(seeds) + j, config_index=i, seed=s, config=dataclasses.replace(c, seed=s))
            for i, c in enumerate(configs) for j, s in enumerate(seeds)]


def train_population(
    env,
    make_network: Callable[[nnx.Rngs], Any] | str,
    configs: Sequence[TrainConfig],
    seeds: Sequence[int],
    *,
    pbt: PBTConfig | None = None,
    **options: Unpack[TrainOptions],
) -> list[TrainResult]:
    """Train one network per (config, seed) member, all in one compiled program.

    Args:
      env: the training env.
      make_network: ``make_network(nnx.Rngs(seed))`` builds a member's
        network from its seed (every member the same architecture), or a
        network's name as for :func:`~nnx_ppo.algorithms.trainer.train_ppo`.
      configs: the :class:`TrainConfig` of each variant; they may differ only
        in :data:`~nnx_ppo.algorithms._hyperparameters.PER_MEMBER` numbers
        (a difference elsewhere raises ``PopulationConfigError`` naming the
        fields). Their ``seed`` is replaced by each seed.
      seeds: the seeds every config is trained with.
      pbt: population-based training (see :mod:`nnx_ppo.algorithms.population`):
        every ``pbt.every_iterations`` iterations the worst members take over
        the states of the best and perturb their hyperparameters. None: the
        members train independently.
      **options: the :class:`~nnx_ppo.algorithms.trainer.TrainOptions`, as for
        :func:`~nnx_ppo.algorithms.population.train_seeds`, with members in place
        of seeds: ``log_fn(metrics, env_steps, member)`` gets the member's
        index; a checkpoint holds every member (its metadata lists each
        member's seed and hyperparameters under ``"members"``), and
        ``nnx_ppo.load_network(directory, seed=i)`` loads member ``i``.

    Returns one :class:`TrainResult` per member, in the order of
    :func:`population_members` (config-major); a member's result matches
    ``train_ppo(env, make_network(nnx.Rngs(seed)), dataclasses.replace(config, seed=seed))``
    up to float rounding (without ``pbt``), and a member fails alone, as a
    seed of a batch does: its result's ``failure`` says where and why, a
    ``run_dir`` records it (a failure row of ``metrics.jsonl``, see
    :data:`nnx_ppo.runner.FAILURE_KEY`), and it stays failed on resume. PBT
    may copy a healthy member's state over a failed one (it ranks last):
    the member stays failed, and its only later rows record that takeover
    (``population/took_over``). Each member's iteration metrics include
    ``population/score``, ``population/parent``, ``population/took_over``
    and ``hyperparameters/<field>``.
    """
    members = population_members(configs, seeds)
    fields = () if pbt is None else pbt_fields(pbt, configs)
    record = {"configs": len(configs), "seeds": [int(s) for s in seeds],
              "pbt": None if pbt is None else dataclasses.asdict(pbt)}
    algorithm = dataclasses.replace(PPO, population_step=population_step(pbt, fields),
                                    failed_member_row=None if pbt is None else failed_member_row,
                                    run_record={"population": record})
    return train(algorithm, env, members[0].config, make_network=make_network, seeds=[m.index for m in members],
                 members=[m.config for m in members], **options)


def pbt_fields(pbt: PBTConfig, configs: Sequence[TrainConfig]) -> tuple[str, ...]:
    """The hyperparameters PBT perturbs: ``pbt.fields``, or those that differ
    between ``configs`` (the learning rate if none does); each must be a
    number for every member."""
    if pbt.fields is not None:
        fields = tuple(pbt.fields)
    else:
        fields = tuple(f for f in PER_MEMBER if len({getattr(c.ppo, f) for c in configs}) > 1) or ("learning_rate",)
    unset = [f for f in fields if any(getattr(c.ppo, f) is None or callable(getattr(c.ppo, f)) for c in configs)]
    if unset:
        raise ValueError(f"PBT cannot perturb {unset}: not a number in every config (set them, or choose "
                         "PBTConfig.fields)")
    return fields


# ----------------------------------------------------------------------------- many seeds


def train_seeds(
    env,
    make_network: Callable[[nnx.Rngs], Any] | str,
    config: TrainConfig,
    seeds: Sequence[int],
    **options: Unpack[TrainOptions],
) -> list[TrainResult]:
    """Train one network per seed, all seeds in one compiled program.

    Like :func:`train_ppo`, it runs on ``config.n_devices`` local devices
    (None: all): by default every seed's envs are split over the devices
    (``n_envs`` divisible by their number); with ``config.shard_seeds`` the
    seeds are (their number divisible by the devices'), so that each device
    trains whole seeds.

    A seed fails alone: when its health fails (non-finite observations,
    rewards or loss, or a replay mismatch) it stays at its last healthy
    state (finite parameters, from the iteration before) while the others
    train to the end, and its result's ``failure`` says at which iteration
    and why; the loop ends early only when every seed has failed.

    Args:
      env: the training env.
      make_network: ``make_network(nnx.Rngs(seed))`` builds one seed's network;
        every seed must get the same architecture. Or the network's name, as
        for :func:`~nnx_ppo.algorithms.ppo.train_ppo` (``"lstm"``,
        ``"FILE.py:FUNCTION"``, ...), which lets the CLI rebuild a ``run_dir``'s networks.
      config: the :class:`TrainConfig`; its ``seed`` is replaced by each seed.
      seeds: the seeds (at least one).
      **options: the :class:`~nnx_ppo.algorithms.trainer.TrainOptions`:
        ``log_fn(metrics, env_steps, seed)`` for every iteration and
        evaluation of every seed (a failed seed's no longer);
        ``checkpoint_dir`` saves the whole seed batch (one checkpoint holds
        every seed's state on a leading axis ``[S, ...]``; its metadata
        lists the ``"seeds"``); ``resume_from`` continues it (the same
        seeds, in the same order; exact, as for one seed); ``eval_env``,
        ``checkpoint_metadata``, ``should_stop``, ``run_dir`` and
        ``progress`` as for ``train_ppo``.

    A seed's network loads from such a checkpoint with
    ``nnx_ppo.load_network(directory, seed=s)``.

    Returns one :class:`TrainResult` per seed, in order; the result for seed
    ``s`` matches ``train_ppo(env, make_network(nnx.Rngs(s)),
    dataclasses.replace(config, seed=s))`` up to float rounding (vmapped
    matrix products may round differently); its trained network is its
    result's ``network``.
    """
    return train(PPO, env, config, make_network=make_network, seeds=seeds, **options)


# ----------------------------------------------------------------------------- population-based training


BOUNDS: dict[str, tuple[float, float]] = per_member_bounds()
"""The range PBT keeps each perturbed hyperparameter in (a member starting
outside it stays where it is until perturbed)."""

NO_TAKEOVER = -1
"""``population/took_over`` of a member that took over no state in that iteration."""

_TOWARDS_ONE = ("discounting_factor", "gae_lambda")  # perturbed as 1 - x: the horizon, not the number near 1


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """Population-based training.

    Attributes:
      every_iterations: iterations between two exploit-and-explore steps.
      fraction: the share of members replaced each time (the worst), and the
        share they copy from (the best); at least one member each.
      perturb_factors: a copied hyperparameter is multiplied by one of these,
        drawn with equal chance (discount and GAE lambda: their distance to 1
        is), then clipped to :data:`BOUNDS`.
      fields: the hyperparameters to perturb (default: those that differ
        between the members at the start; the learning rate if none do).
      score_smoothing: weight of the newest iteration's mean training
        episode return in the running score.
      seed: seeds the choice of members and factors.
    """

    every_iterations: int
    fraction: float = 0.25
    perturb_factors: tuple[float, float] = (0.8, 1.25)
    fields: tuple[str, ...] | None = None
    score_smoothing: float = 0.2
    seed: int = 0

    def __post_init__(self):
        _require_positive_int("PBTConfig", "every_iterations", self.every_iterations)
        if not 0 < self.fraction <= 0.5:
            raise ValueError(f"PBTConfig.fraction must be in (0, 0.5], got {self.fraction}")
        if not all(f > 0 and math.isfinite(f) for f in self.perturb_factors):
            raise ValueError(f"PBTConfig.perturb_factors must be positive numbers, got {self.perturb_factors}")
        if not 0 < self.score_smoothing <= 1:
            raise ValueError(f"PBTConfig.score_smoothing must be in (0, 1], got {self.score_smoothing}")
        unknown = [f for f in self.fields or () if f not in PER_MEMBER]
        if unknown:
            raise ValueError(f"PBTConfig.fields: {unknown} cannot differ per member; choose from {list(PER_MEMBER)}")


def _perturbed(name: str, value: jax.Array, factor: jax.Array) -> jax.Array:
    """``value`` times ``factor`` (for discount and lambda: ``1 - value``
    times it), clipped to the field's bounds."""
    low, high = BOUNDS[name]
    new = 1.0 - (1.0 - value) * factor if name in _TOWARDS_ONE else value * factor
    return jnp.clip(new, low, high)


def _rank_scores(score: jax.Array, healthy: jax.Array) -> jax.Array:
    """What PBT ranks the members by (float32 ``[N]``, higher is better):
    the ``score``; below every score a member without one yet (NaN: no
    episode ended), and below everyone a member whose iteration failed
    (``healthy`` False, bool ``[N]``)."""
    unscored = jnp.finfo(score.dtype).min
    return jnp.where(healthy, jnp.where(jnp.isnan(score), unscored, score), -jnp.inf)


def _exploit_and_explore(state: TrainingState, pbt: PBTConfig, fields: Sequence[str],
                         healthy: jax.Array) -> tuple[TrainingState, jax.Array]:
    """The worst members take over the states of members drawn from the best
    ones and perturb the hyperparameters in ``fields`` (leaves ``[N, ...]``).
    A member whose iteration failed (``healthy`` False, bool ``[N]``) ranks
    worst and is never copied. Returns the new state and, per member, the
    member whose state it took over (int32 ``[N]``, :data:`NO_TAKEOVER` for none)."""
    member = state.member
    n = member.score.shape[0]
    k = max(1, int(n * pbt.fraction))
    key = jax.random.fold_in(jax.random.key(pbt.seed), jnp.max(state.iteration))
    pick_key, factor_key = jax.random.split(key)
    order = jnp.argsort(_rank_scores(member.score, healthy))  # worst first (a stable sort: ties by index)
    sources = order[n - k:][jax.random.randint(pick_key, (k,), 0, k)]
    source = jnp.arange(n).at[order[:k]].set(sources)  # member i takes over member source[i]
    source = jnp.where(healthy[source], source, jnp.arange(n))  # (more than n - k failed: a failed one is no source)
    copied = source != jnp.arange(n)
    taken = jax.tree.map(lambda x: x[source], state)
    factors = jnp.asarray(pbt.perturb_factors, jnp.float32)[
        jax.random.randint(factor_key, (len(fields), n), 0, len(pbt.perturb_factors))]
    values = dict(taken.member.hyperparameters)
    for factor, name in zip(factors, fields):
        values[name] = jnp.where(copied, _perturbed(name, values[name], factor), values[name])
    new_member = dataclasses.replace(taken.member, hyperparameters=values,
                                     parent=jnp.where(copied, source, member.parent).astype(jnp.int32))
    # Each keeps its own key (the copies then explore apart) and iteration count.
    new_state = dataclasses.replace(taken, key=state.key, iteration=state.iteration, member=new_member)
    return new_state, jnp.where(copied, source, NO_TAKEOVER).astype(jnp.int32)


def population_step(pbt: PBTConfig | None, fields: Sequence[str] = ()) -> Callable:
    """``step(state, output) -> (state, output)`` on a population's stacked
    state and iteration output (leaves ``[N, ...]``), run after every
    iteration: updates the scores (a failed iteration, whose metrics are not
    finite, counts for nothing), exploits and explores when due (with
    ``pbt``; ``fields`` are perturbed), and adds the population metrics."""
    smoothing = 0.2 if pbt is None else pbt.score_smoothing

    def step(state: TrainingState, output: IterationOutput) -> tuple[TrainingState, IterationOutput]:
        member = state.member
        healthy = jnp.ones(member.score.shape, bool) if output.health is None else output.health.ok  # (None: all)
        returns = output.metrics["train/episode_return"]
        ended = (output.metrics["train/completed_episodes"] > 0) & healthy
        running = jnp.where(jnp.isnan(member.score), returns, (1 - smoothing) * member.score + smoothing * returns)
        state = dataclasses.replace(state, member=dataclasses.replace(
            member, score=jnp.where(ended, running, member.score)))
        took_over = jnp.full(member.score.shape, NO_TAKEOVER, jnp.int32)
        if pbt is not None and fields:
            due = jnp.max(state.iteration) % pbt.every_iterations == 0
            state, took_over = jax.lax.cond(due, lambda s: _exploit_and_explore(s, pbt, fields, healthy),
                                            lambda s: (s, took_over), state)
        member = state.member
        metrics = {**output.metrics, "population/score": member.score,
                   "population/parent": member.parent.astype(jnp.float32),
                   "population/took_over": took_over.astype(jnp.float32),
                   **{f"hyperparameters/{k}": v for k, v in member.hyperparameters.items()}}
        return state, dataclasses.replace(output, metrics=metrics)

    return step


def failed_member_row(row: dict[str, float]) -> dict[str, float] | None:
    """What the trainer still logs of a failed member's iteration ``row``
    (host floats): when PBT copied a healthy member's state over it in that
    iteration (it *revived* it), ``population/took_over`` and
    ``population/parent``; otherwise nothing (None)."""
    if row.get("population/took_over", NO_TAKEOVER) < 0:
        return None
    return {key: row[key] for key in ("population/took_over", "population/parent")}
