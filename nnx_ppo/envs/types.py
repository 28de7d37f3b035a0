"""The env contract: :class:`EnvState`, the :class:`RLEnv` base class, and
the structural checks of it that training relies on.

The API is functional and single-environment (one episode per call), in the
style of MuJoCo Playground. Trainers ``jax.vmap`` over environments and do
their own auto-reset, so environments never reset themselves: ``step`` on the
transition that ends an episode returns the true final observation.

:func:`check_env_structure` and :func:`check_actions` (nothing runs: shapes
only) are what :func:`~nnx_ppo.algorithms.ppo.train_ppo` calls before
compiling; the fuller :func:`nnx_ppo.testing.check_env` (which steps the env)
builds on the helpers here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.envs import spaces as _spaces
from nnx_ppo.envs.spaces import Box, Discrete

__all__ = ["EnvState", "RLEnv", "EnvCheckError"]


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
        raise NotImplementedError(f"{type(self).__name__} does not support rendering; only environments "
                                  "built on MuJoCo Playground (make('playground:...')) can render.")

    @property
    def unwrapped(self) -> "RLEnv":
        return self

    def __repr__(self):
        return f"{type(self).__name__}()"


# --------------------------------------------------------------------------- checks of the contract


class EnvCheckError(ValueError):
    """Raised by the env checks (:func:`check_env_structure`, :func:`nnx_ppo.testing.check_env`);
    the message names the offending field."""


def fail(msg: str):
    raise EnvCheckError(msg)


def path_name(prefix: str, path) -> str:
    return prefix + jax.tree_util.keystr(path)


def dtype_of(x):
    return x.dtype if hasattr(x, "dtype") else jnp.result_type(x)


def leaves_with_paths(tree, prefix):
    return {path_name(prefix, p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def compare_structure(name, a, b):
    pa, pb = leaves_with_paths(a, name), leaves_with_paths(b, name)
    only_a, only_b = sorted(set(pa) - set(pb)), sorted(set(pb) - set(pa))
    structure_a, structure_b = jax.tree.structure(a), jax.tree.structure(b)
    if only_a or only_b or structure_a != structure_b:
        parts = [f"only in {where}: {keys}" for where, keys in (("reset", only_a), ("step", only_b)) if keys]
        parts = parts or [f"{structure_a} vs {structure_b}"]
        fail(f"{name}: pytree structure differs between reset and step states ({'; '.join(parts)})")
    for k, xa in pa.items():
        sa, sb = np.shape(xa), np.shape(pb[k])
        da, db = dtype_of(xa), dtype_of(pb[k])
        if sa != sb:
            fail(f"{k}: shape differs between reset {sa} and step {sb}")
        if da != db:
            fail(f"{k}: dtype differs between reset ({da}) and step ({db})")


def check_scalar_per_env(name, tree, n_envs):
    for k, x in leaves_with_paths(tree, name).items():
        if np.shape(x) != (n_envs,):
            fail(f"{k}: must be a scalar per environment (batched shape ({n_envs},)), "
                 f"got per-env shape {np.shape(x)[1:]}")
        if dtype_of(x) != jnp.float32:
            fail(f"{k}: dtype must be float32, got {dtype_of(x)}")


def check_env_structure(env, n_envs: int, actions=None) -> None:
    """Shape-only check of ``env`` (``jax.eval_shape``: nothing runs): the
    state has ``obs``/``reward``/``done``/``info["truncated"]``, reward and done
    are float32 scalars per env, and reset and step states have the same
    structure, shapes and dtypes. Raises :class:`EnvCheckError` naming the field.
    ``actions`` (shapes suffice) are what ``step`` receives; by default samples
    of ``env.action_space``. ``train_ppo`` calls it with the network's actions
    before compiling anything."""
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), n_envs))  # (shapes: nothing compiles)
    reset = jax.eval_shape(jax.vmap(env.reset), keys)
    for field in ("obs", "reward", "done", "info"):
        if not hasattr(reset, field):
            fail(f"{field}: the env's reset state has no field {field!r} (expected an EnvState)")
    if not isinstance(reset.info, dict) or "truncated" not in reset.info:
        hint = "" if isinstance(reset, EnvState) else (
            "; an env written for the original nnx-ppo, whose state is not an EnvState, is adapted by "
            "nnx_ppo.envs.as_env, which train_ppo calls")
        fail(f'info["truncated"]: missing from the reset state (set it to 0.0 at reset, 1.0 on time-limit ends){hint}')
    if actions is None:
        actions = jax.eval_shape(jax.vmap(lambda k: _spaces.sample(env.action_space, k)), keys)
    step = jax.eval_shape(jax.vmap(env.step), reset, actions)
    compare_structure("state", reset, step)
    check_scalar_per_env("reward", reset.reward, n_envs)
    check_scalar_per_env("done", step.done, n_envs)
    check_scalar_per_env("info['truncated']", step.info["truncated"], n_envs)


def check_actions(env, actions, B: int) -> None:
    """The network's actions fit the env's ``action_space`` (Box: shape;
    Discrete: integer per env), when the env declares one."""
    space = getattr(env, "action_space", None)
    if isinstance(space, Box):
        expected = (B, *space.shape)
        if not hasattr(actions, "shape") or tuple(actions.shape) != expected:
            got = getattr(actions, "shape", type(actions).__name__)
            raise ValueError(f"the network's actions have shape {got}, expected {expected} (n_envs, "
                             f"*action_space.shape) for the env's action space {space}; check the policy head's "
                             "action_size")
    elif isinstance(space, Discrete):
        if not (hasattr(actions, "shape") and tuple(actions.shape) == (B,)
                and jnp.issubdtype(actions.dtype, jnp.integer)):
            got = (getattr(actions, "shape", None), getattr(actions, "dtype", type(actions).__name__))
            raise ValueError(f"the network's actions are {got}, expected integer actions of shape ({B},) for the "
                             f"env's discrete action space {space}; use a CategoricalSampler head")
