"""Core environment types: :class:`EnvState` and the :class:`RLEnv` base class.

The API is functional and single-environment (one episode per call), in the
style of MuJoCo Playground. Trainers ``jax.vmap`` over environments and do
their own auto-reset, so environments never reset themselves: ``step`` on the
transition that ends an episode returns the true final observation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["EnvState", "RLEnv", "as_f32"]


def as_f32(x: Any) -> jax.Array:
    """``x`` as a float32 array (the dtype of rewards, ``done`` and ``truncated``)."""
    return jnp.asarray(x, dtype=jnp.float32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvState:
    """State of one environment after ``reset`` or ``step``.

    Attributes:
      obs: observation (array, or pytree of arrays matching ``observation_space``).
      reward: float32 scalar (or a dict of float32 scalars) for the last transition;
        0 after reset.
      done: float32 scalar, 1.0 when the episode ended (terminated OR truncated).
      metrics: dict of scalar arrays for logging.
      info: dict; always contains ``"truncated"`` (float32 0/1): 1 when a time limit
        (not a true termination) ended the episode.
      data: the wrapped environment's own state (any pytree), or None.

    ``reset`` and ``step`` must return states with identical pytree structure,
    shapes and dtypes, so trainers can ``jnp.where(done, reset_state, state)``.
    """

    obs: Any
    reward: Any
    done: Any
    metrics: dict = dataclasses.field(default_factory=dict)
    info: dict = dataclasses.field(default_factory=dict)
    data: Any = None

    def replace(self, **changes) -> "EnvState":
        return dataclasses.replace(self, **changes)


class RLEnv:
    """Base class of nnx_ppo environments.

    Subclasses implement ``reset(key)``, ``step(state, action)`` and the
    ``observation_space`` / ``action_space`` properties. Both methods are pure
    functions of their inputs and must be jit- and vmap-compatible.
    """

    #: Whether ``check_env`` should require PRNG keys found in ``state.data`` to
    #: change on every step. Adapters over third-party envs set this to False:
    #: those envs may keep a key that is only used at reset.
    check_keys_in_data: bool = True

    def reset(self, key: jax.Array) -> EnvState:
        raise NotImplementedError

    def step(self, state: EnvState, action) -> EnvState:
        raise NotImplementedError

    @property
    def observation_space(self):
        raise NotImplementedError

    @property
    def action_space(self):
        raise NotImplementedError

    def render(self, states, **kwargs):
        """Render a trajectory (a sequence of un-batched states) to frames."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support rendering; only environments "
            "built on MuJoCo Playground (make('playground:...')) can render."
        )

    @property
    def unwrapped(self) -> "RLEnv":
        return self

    def __repr__(self):
        return f"{type(self).__name__}()"
