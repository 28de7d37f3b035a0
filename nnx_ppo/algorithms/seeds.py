"""Many seeds in one compiled program.

:func:`train_seeds` builds one network and one training state per seed,
stacks the states on a leading seed axis ``[S, ...]`` (parameters, optimizer
state, env states, carries, keys) and runs the PPO iteration over it, vmapped
or one seed after another (``TrainConfig.seed_batching``, see
:func:`~nnx_ppo.algorithms.ppo.over_seeds`), on the one trainer
(:func:`nnx_ppo.algorithms.trainer.train`), the same as
:func:`~nnx_ppo.algorithms.trainer.train_ppo`. One compile serves every seed. On
several devices the batch is sharded like one seed's training (by env), or by
seed (``TrainConfig.shard_seeds``), see :mod:`nnx_ppo.algorithms.sharding`;
with both, each device runs its own seeds, which is how several CPU devices
(one per core) train many seeds fastest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Unpack

from flax import nnx

from nnx_ppo.algorithms.config import TrainConfig
from nnx_ppo.algorithms.trainer import PPO, TrainOptions, TrainResult, train

__all__ = ["train_seeds"]


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
        for :func:`~nnx_ppo.algorithms.trainer.train_ppo` (``"lstm"``,
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
