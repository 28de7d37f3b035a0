"""Sweeps: many configs and seeds trained in one compiled program.

:func:`train_population` trains every (config, seed) pair, a *member*, the
way :func:`~nnx_ppo.algorithms.seeds.train_seeds` trains seeds: one network
and one training state per member, stacked on a leading axis ``[N, ...]``,
the PPO iteration run over it (vmapped, or in turn with
``TrainConfig.seed_batching="map"``; sharded by member with
``TrainConfig.shard_seeds``) on the one trainer. The members' configs may
differ only in the numbers of
:data:`~nnx_ppo.algorithms.hyperparameters.PER_MEMBER` (learning rate, clip
range, discount, GAE lambda, critic weight, regularization (entropy) weight,
reward scale, gradient-clip norm, value clip range, target KL); each member
carries its own in its state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Unpack

from flax import nnx

from nnx_ppo.algorithms.config import TrainConfig, check_seeds
from nnx_ppo.algorithms.hyperparameters import PER_MEMBER, check_population
from nnx_ppo.algorithms.pbt import PBTConfig, failed_member_row, population_step
from nnx_ppo.algorithms.trainer import PPO, TrainOptions, TrainResult, train

__all__ = ["Member", "population_members", "train_population", "pbt_fields"]


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
        program (see :func:`~nnx_ppo.algorithms.hyperparameters.check_population`).
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
        in :data:`~nnx_ppo.algorithms.hyperparameters.PER_MEMBER` numbers
        (a difference elsewhere raises ``PopulationConfigError`` naming the
        fields). Their ``seed`` is replaced by each seed.
      seeds: the seeds every config is trained with.
      pbt: population-based training (see :mod:`nnx_ppo.algorithms.pbt`):
        every ``pbt.every_iterations`` iterations the worst members take over
        the states of the best and perturb their hyperparameters. None: the
        members train independently.
      **options: the :class:`~nnx_ppo.algorithms.trainer.TrainOptions`, as for
        :func:`~nnx_ppo.algorithms.seeds.train_seeds`, with members in place
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
    :data:`nnx_ppo.run_dir.FAILURE_KEY`), and it stays failed on resume. PBT
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
