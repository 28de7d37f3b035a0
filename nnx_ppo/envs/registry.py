"""``make(spec)`` and ``list_envs()``: build environments from string specs."""

from __future__ import annotations

from typing import Callable

from nnx_ppo.envs.tasks import CartpoleNoVelocity, ConstantReward, CueMemory
from nnx_ppo.envs.types import RLEnv
from nnx_ppo.envs.wrappers import TimeLimit

__all__ = ["make", "as_env", "list_envs", "register"]

# name -> (constructor, default episode length or None for self-terminating tasks)
_BUILTINS: dict[str, tuple[Callable[..., RLEnv], int | None]] = {
    "cue_memory": (CueMemory, None),
    "cartpole_no_velocity": (CartpoleNoVelocity, 200),
    "constant_reward": (ConstantReward, 1000),
}

_GYMNAX_EXAMPLES = [
    "gymnax:CartPole-v1",
    "gymnax:Pendulum-v1",
    "gymnax:Acrobot-v1",
    "gymnax:MountainCarContinuous-v0",
    "gymnax:MemoryChain-bsuite",
]
_PLAYGROUND_EXAMPLES = ["playground:CartpoleBalance", "playground:PendulumSwingup", "playground:CheetahRun"]
_BRAX_EXAMPLES = ["brax:inverted_pendulum", "brax:ant", "brax:halfcheetah"]

_PREFIXES = ("gymnax", "playground", "brax")


def register(name: str, constructor: Callable[..., RLEnv], episode_length: int | None = None) -> None:
    """Register a built-in-style env under a plain name (no ``:``)."""
    if ":" in name:
        raise ValueError(f"plain env names cannot contain ':', got {name!r}")
    _BUILTINS[name] = (constructor, episode_length)


def list_envs() -> list[str]:
    """Built-in names, plus example specs for the gymnax/playground/brax adapters."""
    return sorted(_BUILTINS) + _GYMNAX_EXAMPLES + _PLAYGROUND_EXAMPLES + _BRAX_EXAMPLES


def _missing(extra: str, package: str, err: ImportError) -> ImportError:
    return ImportError(
        f"{package} is needed for '{extra}:' environments but could not be imported ({err}). "
        f'Install it with: pip install "nnx_ppo[{extra}]"'
    )


def _time_limit(env: RLEnv, episode_length, random_initial_steps: bool, random_reset_steps: int) -> RLEnv:
    if episode_length is None:
        return env
    return TimeLimit(env, int(episode_length), random_initial_steps, random_reset_steps)


def make(spec: str, **kwargs) -> RLEnv:
    """Build an environment from a spec string.

    * ``"NAME"``: a built-in task (see ``list_envs()``); kwargs go to its
      constructor, except ``episode_length`` (wraps in ``TimeLimit``; built-in
      default: 200 for cartpole_no_velocity, 1000 for constant_reward, none for
      cue_memory), ``random_initial_steps`` and ``random_reset_steps`` (see
      :class:`~nnx_ppo.envs.wrappers.TimeLimit`).
    * ``"gymnax:NAME"``: kwargs override gymnax env params (e.g.
      ``max_steps_in_episode=100``), plus ``random_initial_steps`` and
      ``random_reset_steps`` (they add a ``TimeLimit`` at the env's limit).
    * ``"playground:NAME"``: kwargs are Playground config overrides, plus
      ``episode_length`` (default: the config's ``episode_length``, else 1000),
      ``random_initial_steps`` and ``random_reset_steps``. ``impl`` defaults to
      ``"jax"`` (MJX); ``impl="warp"`` selects MuJoCo Warp (see docs/environments.md).
    * ``"brax:NAME"``: kwargs go to ``brax.envs.get_environment``, plus
      ``episode_length`` (default 1000), ``random_initial_steps`` and ``random_reset_steps``.
    """
    if not isinstance(spec, str):
        raise TypeError(f"make expects a string spec, got {spec!r}")
    random_initial_steps = bool(kwargs.pop("random_initial_steps", False))
    random_reset_steps = int(kwargs.pop("random_reset_steps", 0))
    prefix, sep, name = spec.partition(":")

    if not sep:
        if spec not in _BUILTINS:
            raise ValueError(f"Unknown environment {spec!r}. Available: {', '.join(list_envs())}")
        ctor, default_len = _BUILTINS[spec]
        episode_length = kwargs.pop("episode_length", default_len)
        return _time_limit(ctor(**kwargs), episode_length, random_initial_steps, random_reset_steps)

    if prefix not in _PREFIXES or not name:
        raise ValueError(
            f"Unknown environment spec {spec!r}: expected a built-in name or one of the prefixes "
            f"{', '.join(p + ':' for p in _PREFIXES)}. Available: {', '.join(list_envs())}"
        )

    build = {"gymnax": _make_gymnax, "playground": _make_playground, "brax": _make_brax}[prefix]
    return build(spec, name, kwargs, random_initial_steps, random_reset_steps)


def _make_gymnax(spec: str, name: str, kwargs: dict, random_initial_steps: bool, random_reset_steps: int) -> RLEnv:
    import gymnax

    from nnx_ppo.envs.adapters import GymnaxEnv

    if name not in gymnax.registered_envs:
        raise ValueError(
            f"Unknown environment {spec!r}: gymnax has no {name!r}. "
            f"Available gymnax envs: {', '.join(gymnax.registered_envs)}"
        )
    episode_length = kwargs.pop("episode_length", None)
    if episode_length is not None:
        kwargs["max_steps_in_episode"] = int(episode_length)
    env = GymnaxEnv(name, **kwargs)
    if not (random_initial_steps or random_reset_steps):
        return env
    return TimeLimit(env, int(env.params.max_steps_in_episode), random_initial_steps, random_reset_steps)


def _make_playground(spec: str, name: str, kwargs: dict, random_initial_steps: bool,
                     random_reset_steps: int) -> RLEnv:
    try:
        from mujoco_playground import registry as pg_registry
    except ImportError as e:
        raise _missing("playground", "mujoco_playground", e) from e
    from nnx_ppo.envs.adapters import PlaygroundEnv

    if name not in pg_registry.ALL_ENVS:
        raise ValueError(
            f"Unknown environment {spec!r}: MuJoCo Playground has no {name!r}. "
            f"Available: {', '.join(pg_registry.ALL_ENVS)}"
        )
    episode_length = kwargs.pop("episode_length", None)
    overrides = {"impl": "jax", **kwargs}
    pg_env = pg_registry.load(name, config_overrides=overrides)
    if episode_length is None:
        cfg = getattr(pg_env, "_config", None)
        episode_length = cfg.get("episode_length", 1000) if cfg is not None and hasattr(cfg, "get") else 1000
    return TimeLimit(PlaygroundEnv(pg_env, name), int(episode_length), random_initial_steps, random_reset_steps)


def _make_brax(spec: str, name: str, kwargs: dict, random_initial_steps: bool, random_reset_steps: int) -> RLEnv:
    try:
        import brax.envs as brax_envs
    except ImportError as e:
        raise _missing("brax", "brax", e) from e
    from nnx_ppo.envs.adapters import BraxEnv

    if name not in brax_envs._envs:  # noqa: SLF001 -- brax exposes no public listing
        raise ValueError(
            f"Unknown environment {spec!r}: brax has no {name!r}. Available: {', '.join(sorted(brax_envs._envs))}"
        )
    episode_length = kwargs.pop("episode_length", 1000)
    env = BraxEnv(brax_envs.get_environment(name, **kwargs), name)
    return TimeLimit(env, int(episode_length), random_initial_steps, random_reset_steps)


def _playground_episode_length(pg_env) -> int:
    cfg = getattr(pg_env, "_config", None)
    return int(cfg.get("episode_length", 1000)) if cfg is not None and hasattr(cfg, "get") else 1000


def as_env(env, *, episode_length: int | None = None, random_initial_steps: bool = False,
           random_reset_steps: int = 0) -> RLEnv:
    """``env`` in this library's env API, wrapping a third-party env as it ships.

    * an :class:`~nnx_ppo.envs.types.RLEnv` is returned unchanged;
    * a raw MuJoCo Playground env (``mujoco_playground.registry.load(...)``)
      gets :class:`~nnx_ppo.envs.adapters.PlaygroundEnv` and a
      :class:`~nnx_ppo.envs.wrappers.TimeLimit` at ``episode_length`` (default:
      the env config's ``episode_length``, else 1000), as ``make("playground:NAME")`` does;
    * a Brax env (``brax.envs.get_environment(...)``) likewise, default 1000 steps;
    * a gymnax env instance gets :class:`~nnx_ppo.envs.adapters.GymnaxEnv`
      (its own time limit);
    * any other object with ``reset`` and ``step`` is returned unchanged (the
      checks before training name what it lacks); anything else is a TypeError.

    ``train_ppo``, ``train_seeds``, ``new_training_state`` and
    ``check_replay_consistency`` call it on the envs they are given.
    """
    if isinstance(env, RLEnv):
        return env
    module = type(env).__module__.split(".")[0]
    name = type(env).__name__
    if module == "mujoco_playground":
        from nnx_ppo.envs.adapters import PlaygroundEnv

        length = episode_length if episode_length is not None else _playground_episode_length(env)
        return TimeLimit(PlaygroundEnv(env, name), int(length), random_initial_steps, random_reset_steps)
    if module == "brax":
        from nnx_ppo.envs.adapters import BraxEnv

        length = episode_length if episode_length is not None else 1000
        return TimeLimit(BraxEnv(env, name), int(length), random_initial_steps, random_reset_steps)
    if module == "gymnax":
        from nnx_ppo.envs.adapters import GymnaxEnv

        return GymnaxEnv(env)
    if callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        return env  # duck-typed: the env checks before training validate it
    raise TypeError(
        f"expected an env with this library's API (an nnx_ppo.envs.RLEnv: reset(key) / step(state, action) "
        f"returning EnvState with info['truncated']), a MuJoCo Playground, Brax or gymnax env; got {name} "
        f"from {type(env).__module__}. See docs/environments.md"
    )

