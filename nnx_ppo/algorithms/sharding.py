"""Sharding training over local devices (``jax.sharding``).

By env: the env states, network carries and running episode statistics
(leaves ``[B, ...]``, or ``[S, B, ...]`` for a seed batch) are split over a
one-axis :class:`~jax.sharding.Mesh` named ``"envs"``; parameters, optimizer
state and keys are replicated. The jitted iteration is the same program: XLA
partitions the rollout and the replay by env and inserts the all-reduce of
the gradient. Minibatches take an equal share of every device's envs
(``PPOConfig.shuffle_blocks``), so no env sequence moves between devices.

By seed (a seed batch of :func:`~nnx_ppo.algorithms.seeds.train_seeds` with
``TrainConfig.shard_seeds``): every leaf of the ``[S, ...]`` state is split
on its seed axis over a mesh named ``"seeds"``; each device trains whole
seeds and nothing crosses devices during an iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.distributed import to_global

__all__ = [
    "local_devices",
    "env_mesh",
    "seed_mesh",
    "state_shardings",
    "seed_shardings",
    "sharded_config",
    "place",
    "replicated",
    "ENV_AXIS",
    "SEED_AXIS",
]

ENV_AXIS = "envs"
SEED_AXIS = "seeds"


def local_devices(n_devices: int | None, n_envs: int, n_seeds: int | None = None) -> list:
    """The first ``n_devices`` local devices (all when None); named errors
    when there are fewer or when ``n_envs`` (with ``n_seeds``: the number of
    seeds, split by seed) does not split evenly. In a run of several
    processes (:func:`nnx_ppo.algorithms.distributed.initialize`), every process's
    devices: the mesh spans them all."""
    if jax.process_count() > 1:
        available = jax.devices()
        if n_devices not in (None, len(available)):
            raise ValueError(f"TrainConfig.n_devices is {n_devices}, but a run of {jax.process_count()} processes "
                             f"uses all their {len(available)} devices; set n_devices=None")
        n_devices = None
    else:
        available = jax.local_devices()
    n = len(available) if n_devices is None else n_devices
    if n > len(available):
        raise ValueError(f"TrainConfig.n_devices is {n_devices} but only {len(available)} local devices exist "
                         f"({available[0].platform})")
    if n_seeds is not None:
        if n_seeds % n:
            raise ValueError(f"the number of seeds ({n_seeds}) must be divisible by the number of devices ({n}) to "
                             "shard the seeds over them (TrainConfig.shard_seeds); change the seeds, "
                             "TrainConfig.n_devices, or shard the envs instead (shard_seeds=False)")
        return available[:n]
    if n_envs % n:
        raise ValueError(f"PPOConfig.n_envs ({n_envs}) must be divisible by the number of devices ({n}) to shard "
                         "the envs over them; change n_envs or TrainConfig.n_devices")
    return available[:n]


def env_mesh(devices: list) -> Mesh:
    """A one-axis mesh over ``devices`` named :data:`ENV_AXIS`."""
    return Mesh(np.asarray(devices), (ENV_AXIS,))


def seed_mesh(devices: list) -> Mesh:
    """A one-axis mesh over ``devices`` named :data:`SEED_AXIS`."""
    return Mesh(np.asarray(devices), (SEED_AXIS,))


def sharded_config(config: PPOConfig, n_devices: int) -> PPOConfig:
    """``config`` with ``shuffle_blocks`` a multiple of ``n_devices`` (1 becomes
    ``n_devices``), so that every block lies on one device."""
    blocks = config.shuffle_blocks
    if blocks % n_devices == 0:
        return config
    if blocks != 1:
        raise ValueError(f"PPOConfig.shuffle_blocks ({blocks}) must be a multiple of the number of devices "
                         f"({n_devices}) (or 1, which means one block per device)")
    try:
        return dataclasses.replace(config, shuffle_blocks=n_devices)
    except ValueError as err:
        raise ValueError(f"sharding over {n_devices} devices uses {n_devices} shuffle blocks: {err}") from None


def state_shardings(state: Any, mesh: Mesh, seed_batch: bool = False) -> Any:
    """Shardings for a :class:`~nnx_ppo.algorithms.ppo.TrainingState`: its
    rollout state and per-env return statistics split on their env axis
    (the leading one; the second with ``seed_batch``, whose leaves are
    ``[S, B, ...]``), everything else replicated (a pytree of the state's
    structure)."""
    replicated = NamedSharding(mesh, PartitionSpec())
    by_env = NamedSharding(mesh, PartitionSpec(None, ENV_AXIS) if seed_batch else PartitionSpec(ENV_AXIS))
    every = lambda tree, sharding: jax.tree.map(lambda _: sharding, tree)
    stats = state.return_stats
    return dataclasses.replace(
        every(state, replicated),
        rollout=every(state.rollout, by_env),
        return_stats=dataclasses.replace(every(stats, replicated),
                                         discounted_return=by_env),
    )


def seed_shardings(state: Any, mesh: Mesh) -> Any:
    """Shardings for a seed batch ``[S, ...]`` split by seed: every leaf on
    its leading axis over ``mesh`` (see :func:`seed_mesh`)."""
    by_seed = NamedSharding(mesh, PartitionSpec(SEED_AXIS))
    return jax.tree.map(lambda _: by_seed, state)


def place(state: Any, ppo: PPOConfig, devices: list, *, seed_batch: bool = False,
          by_seed: bool = False) -> tuple[Any, PPOConfig, Any, Mesh | None]:
    """Put a training state on ``devices`` (from :func:`local_devices`):
    by env (:func:`state_shardings`; ``seed_batch`` for ``[S, ...]`` states)
    or, with ``by_seed``, by seed (:func:`seed_shardings`). Returns the placed
    state, the config to compile with (:func:`sharded_config` when split by
    env), the shardings and the mesh; on one device the state and config
    unchanged and ``None, None``."""
    if len(devices) == 1:
        return state, ppo, None, None
    if by_seed:
        mesh = seed_mesh(devices)
        shardings = seed_shardings(state, mesh)
    else:
        mesh = env_mesh(devices)
        ppo = sharded_config(ppo, len(devices))
        shardings = state_shardings(state, mesh, seed_batch=seed_batch)
    return to_global(state, shardings), ppo, shardings, mesh


def replicated(tree: Any, mesh: Mesh | None) -> Any:
    """``tree`` readable by this process: in a run of several processes,
    every leaf replicated on every device of ``mesh`` (a seed's slice may
    live on another process); alone or without a mesh, ``tree`` itself."""
    if mesh is None or jax.process_count() == 1:
        return tree
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.jit(lambda t: t, out_shardings=jax.tree.map(lambda _: sharding, tree))(tree)
