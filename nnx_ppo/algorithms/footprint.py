"""What a config needs in memory, known before anything is allocated.

:func:`check_footprint` estimates the bytes of the buffers one training
iteration holds (the envs' states, the network's carries and the rollout's
trajectory with its copies for the update) from shapes alone, and refuses a
config that cannot fit in the memory of the device it trains on (the host's
for a CPU) in one line giving the estimate. It also warns when
``total_steps`` is rounded up by more than 10x to whole iterations.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import jax
import numpy as np

__all__ = ["FootprintError", "FootprintWarning", "estimate_bytes", "available_bytes", "check_footprint",
           "TRAJECTORY_COPIES"]

TRAJECTORY_COPIES = 4
"""How many times an iteration holds its trajectory: as recorded, gathered
for an epoch, one minibatch's replay activations kept for the backward pass
(about one more), and the next rollout's buffer while XLA reuses none of them."""


class FootprintError(ValueError):
    """A config whose buffers cannot fit in the memory it would train in."""


class FootprintWarning(UserWarning):
    """A config that trains far more env steps than asked for (whole iterations)."""


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # a typed key: its raw data (2 uint32 for threefry)
        return 4 * math.prod(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)
    return np.dtype(dtype).itemsize


def _tree_bytes(tree: Any) -> int:
    return sum(math.prod(leaf.shape) * _itemsize(leaf.dtype) for leaf in jax.tree.leaves(tree))


def estimate_bytes(env, network, n_envs: int, rollout_length: int, entries: int = 1) -> int:
    """Bytes of the buffers an iteration of ``entries`` members with
    ``n_envs`` envs each holds at least: per env, its state and the
    network's carry (twice: before and after a step) and, per rollout step,
    the observation, the carry the replay starts from and a dozen scalars
    (action, log-likelihood, value, reward, done, ...), :data:`TRAJECTORY_COPIES`
    times. Computed from shapes (``jax.eval_shape``), nothing allocated."""
    from nnx_ppo.algorithms.functional import NetworkFn

    state = jax.eval_shape(lambda key: env.reset(key), jax.random.key(0))
    carry = jax.eval_shape(lambda view: view.initialize(1)[0], NetworkFn.of(network))
    obs, per_env_state, per_env_carry = _tree_bytes(state.obs), _tree_bytes(state), _tree_bytes(carry)
    per_step = obs + per_env_carry + 12 * 4
    per_env = 2 * (per_env_state + per_env_carry) + TRAJECTORY_COPIES * rollout_length * per_step
    return entries * n_envs * per_env


def available_bytes(device=None) -> tuple[int | None, str]:
    """``(bytes, what)`` of memory the program can use on ``device`` (the
    first device by default): an accelerator's memory limit, or the host's
    physical memory for a CPU; None where it cannot be read."""
    device = jax.devices()[0] if device is None else device
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return (int(limit), f"{device.device_kind} memory") if limit else (None, "")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
    except (ValueError, OSError, AttributeError):
        return None, ""


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def check_footprint(env, network, ppo, entries: int = 1, devices: int = 1, warn: bool = True) -> None:
    """Refuse ``ppo`` (a :class:`~nnx_ppo.algorithms.config.PPOConfig`) in one
    line when its buffers (:func:`estimate_bytes`, split over ``devices``)
    cannot fit in one device's memory (:func:`available_bytes`); with
    ``warn``, warn when ``total_steps`` is rounded up by more than 10x to
    whole iterations."""
    per_iteration = ppo.n_envs * ppo.rollout_length
    if warn and ppo.total_steps and per_iteration > 10 * ppo.total_steps:
        warnings.warn(f"ppo.total_steps {ppo.total_steps:,} is rounded up to one iteration of {per_iteration:,} env "
                      f"steps (n_envs {ppo.n_envs:,} x rollout_length {ppo.rollout_length}), "
                      f"{per_iteration / ppo.total_steps:,.0f}x as many; lower n_envs or raise total_steps",
                      FootprintWarning, stacklevel=3)
    need = estimate_bytes(env, network, ppo.n_envs, ppo.rollout_length, entries) / max(devices, 1)
    have, where = available_bytes()
    if have is not None and need > have:
        members = f" x {entries} members" if entries > 1 else ""
        raise FootprintError(f"this config needs at least {_gb(need)} for its rollout buffers (n_envs "
                             f"{ppo.n_envs:,} x rollout_length {ppo.rollout_length}{members}), more than the "
                             f"{_gb(have)} of {where}; lower n_envs or rollout_length")
