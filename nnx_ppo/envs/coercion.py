"""``as_env(env)``: any env a user hands the trainers, in this library's env
API, a third-party env wrapped as it ships (Playground, Brax, gymnax, the
original nnx-ppo's protocol)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nnx_ppo.envs.types import RLEnv

__all__ = ["as_env", "playground_episode_length"]


def playground_episode_length(pg_env) -> int:
    """A Playground env's configured ``episode_length`` (default 1000)."""
    cfg = getattr(pg_env, "_config", None)
    return int(cfg.get("episode_length", 1000)) if cfg is not None and hasattr(cfg, "get") else 1000


def _as_original_env(env) -> RLEnv | None:
    """``env`` in :class:`~nnx_ppo.envs.adapters.OriginalEnv` (with the
    one-line note) when its reset state is the original nnx-ppo's kind: has
    ``obs``, ``reward`` and ``done`` but is not an
    :class:`~nnx_ppo.envs.types.EnvState`; None otherwise (this library's
    API, or something the env checks will name). The reset is traced, not run."""
    import warnings

    from nnx_ppo.envs.adapters import EnvAdaptedWarning, OriginalEnv
    from nnx_ppo.envs.types import EnvState

    adapted = OriginalEnv(env)
    try:
        state = adapted.reset_shapes()
    except Exception:  # noqa: BLE001 -- not ours to diagnose here: the env checks run the reset and name it
        return None
    if isinstance(state, EnvState) or not all(hasattr(state, f) for f in ("obs", "reward", "done")):
        return None
    warnings.warn(
        f"nnx_ppo: {adapted.name} follows the original nnx-ppo's env protocol; adapted with OriginalEnv "
        f"({adapted.describe(state)}). See docs/environments.md#envs-written-for-the-original-nnx-ppo",
        EnvAdaptedWarning,
        stacklevel=3,
    )
    return adapted


def as_env(env, *, episode_length: int | None = None, random_initial_steps: bool = False,
           random_reset_steps: int = 0) -> RLEnv:
    """``env`` in this library's env API, wrapping a third-party env as it ships.

    * an :class:`~nnx_ppo.envs.types.RLEnv` is returned unchanged;
    * a string is an env spec, built by :func:`make`;
    * a raw MuJoCo Playground env (``mujoco_playground.registry.load(...)``)
      gets :class:`~nnx_ppo.envs.adapters.PlaygroundEnv` and a
      :class:`~nnx_ppo.envs.wrappers.TimeLimit` at ``episode_length`` (default:
      the env config's ``episode_length``, else 1000), as ``make("playground:NAME")`` does;
    * a Brax env (``brax.envs.get_environment(...)``) likewise, default 1000 steps;
    * a gymnax env instance gets :class:`~nnx_ppo.envs.adapters.GymnaxEnv`
      (its own time limit);
    * an env written for the original nnx-ppo (``reset``/``step`` returning
      a state with ``obs``, ``reward``, ``done`` and ``info`` that is not an
      :class:`~nnx_ppo.envs.types.EnvState`) gets
      :class:`~nnx_ppo.envs.adapters.OriginalEnv`, with a one-line
      :class:`~nnx_ppo.envs.adapters.EnvAdaptedWarning` saying how; a
      :class:`~nnx_ppo.envs.wrappers.TimeLimit` only when ``episode_length``
      is given (its own ``done`` ends its episodes);
    * any other object with ``reset`` and ``step`` is returned unchanged (the
      checks before training name what it lacks); anything else is a TypeError.

    ``train_ppo``, ``train_seeds``, ``new_training_state`` and
    ``check_replay_consistency`` call it on the envs they are given.
    """
    from nnx_ppo.envs.types import RLEnv
    from nnx_ppo.envs.wrappers import TimeLimit

    if isinstance(env, RLEnv):
        return env
    if isinstance(env, str):
        from nnx_ppo.envs.registry import make

        return make(env)
    module = type(env).__module__.split(".")[0]
    name = type(env).__name__
    # a Playground env, or a subclass of one (vnl-playground's, the rodent tasks)
    if any(cls.__module__.split(".")[0] == "mujoco_playground" for cls in type(env).__mro__):
        from nnx_ppo.envs.adapters import PlaygroundEnv

        length = episode_length if episode_length is not None else playground_episode_length(env)
        return TimeLimit(PlaygroundEnv(env, name), int(length), random_initial_steps, random_reset_steps)
    if module == "brax":
        from nnx_ppo.envs.adapters import BraxEnv

        length = episode_length if episode_length is not None else 1000
        return TimeLimit(BraxEnv(env, name), int(length), random_initial_steps, random_reset_steps)
    if module == "gymnax":
        from nnx_ppo.envs.adapters import GymnaxEnv

        return GymnaxEnv(env)
    if callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        original = _as_original_env(env)
        if original is None:
            return env  # duck-typed: the env checks before training validate it
        if episode_length is None:
            return original
        return TimeLimit(original, int(episode_length), random_initial_steps, random_reset_steps)
    raise TypeError(
        f"expected an env with this library's API (an nnx_ppo.envs.RLEnv: reset(key) / step(state, action) "
        f"returning EnvState with info['truncated']), a MuJoCo Playground, Brax or gymnax env; got {name} "
        f"from {type(env).__module__}. See docs/environments.md"
    )
