"""``make(spec)`` and ``list_envs()``: build environments from string specs.

A spec is a plain name (a built-in task, or one added with :func:`register`),
``PREFIX:NAME``, where ``PREFIX`` names an env source (``gymnax``,
``playground``, ``brax``, one added with :func:`register_source`, or one an
installed package declares under the entry-point group
``nnx_ppo.env_sources``), or the user's own env class or function as
``path/to/file.py:NAME`` or ``package.module:NAME``. :func:`as_env` takes any env a user hands the
trainers (a spec, an env of this library's API, a third-party env as it
ships: Playground, Brax, gymnax, the original nnx-ppo's protocol) into this
library's API. This module imports JAX only when it builds an env, so
listing what there is (``list_envs``, ``nnx-ppo envs``) stays cheap.

The user's own code (the section at the end): :func:`load` finds what a
reference ``path/to/file.py:NAME`` or ``package.module:NAME`` names (an env,
or a network function for :mod:`nnx_ppo.network_spec`); :func:`snapshot`
copies the files behind a run's references into its run directory
(``source/``) with their hashes, and :func:`use_run_copies` makes a later
command load those copies when a file has since moved or changed, so that a
run stays rebuildable the way a saved model file does.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib
import importlib.util
import os
import shutil
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nnx_ppo.envs.types import RLEnv

__all__ = ["make", "list_envs", "register", "register_source", "unregister_source", "EnvSource", "as_env"]

ENTRY_POINT_GROUP = "nnx_ppo.env_sources"
"""The entry-point group an installed package declares env sources under:
each entry point's name is the prefix, its object an :class:`EnvSource` or a
factory ``factory(NAME, **kwargs)`` (described by its docstring's first line)."""


def _lazy(module: str, attr: str, *args: Any, **defaults: Any) -> Callable[..., RLEnv]:
    """A constructor that imports ``module`` (and JAX) when first called and
    returns ``module.attr(*args, **defaults, **kwargs)``: a task class of
    :mod:`nnx_ppo.envs.tasks`, or a rodent task (needs ``nnx_ppo[rodent]``)."""

    def construct(**kwargs) -> RLEnv:
        return getattr(importlib.import_module(module), attr)(*args, **{**defaults, **kwargs})

    construct.__name__ = construct.__qualname__ = args[0] if args else attr
    return construct


_task = functools.partial(_lazy, "nnx_ppo.envs.tasks")
_rodent = functools.partial(_lazy, "nnx_ppo.envs.rodent", "make_env")


# name -> (constructor, default episode length or None for self-terminating tasks)
_BUILTINS: dict[str, tuple[Callable[..., RLEnv], int | None]] = {
    "cue_memory": (_task("CueMemory"), None),
    # the cue 40 steps before the answer: longer than the default rollout (32 steps)
    "cue_memory_long": (_task("CueMemory", n_cues=4, delay=40), None),
    "cartpole_no_velocity": (_task("CartpoleNoVelocity"), 200),
    "constant_reward": (_task("ConstantReward"), 1000),
    # three two-joint limbs, each reaching for its own target: dict observations, actions and rewards
    "limb_reacher": (_task("LimbReacher"), 50),
    # dm-control's virtual rodent under MJX (docs/rodent.md): clips end (truncate) within 150 steps; 10 s runs
    "rodent_imitation": (_rodent("rodent_imitation"), 150),
    "rodent_run": (_rodent("rodent_run"), 500),
}


def register(name: str, constructor: Callable[..., RLEnv], episode_length: int | None = None) -> None:
    """Register a built-in-style env under a plain name (no ``:``; for a
    family of envs ``PREFIX:NAME`` see :func:`register_source`)."""
    if ":" in name:
        raise ValueError(f"plain env names cannot contain ':', got {name!r}")
    _BUILTINS[name] = (constructor, episode_length)


@dataclasses.dataclass(frozen=True)
class EnvSource:
    """A family of environments that ``make("PREFIX:NAME")`` builds (see :func:`register_source`).

    Attributes:
      prefix: the part of the spec before ``:``.
      factory: ``factory(NAME, **kwargs)`` builds the env.
      description: one line for listings and help.
      examples: example specs (``"PREFIX:NAME"``) for listings.
    """

    prefix: str
    factory: Callable[..., Any]
    description: str = ""
    examples: tuple[str, ...] = ()


# prefix -> source, in registration order (the order of listings)
_SOURCES: dict[str, EnvSource] = {}


def register_source(prefix: str, factory: Callable[..., Any], *, description: str = "",
                    example: str | Sequence[str] | None = None) -> None:
    """Make ``make("PREFIX:NAME", **kwargs)`` build envs with ``factory(NAME, **kwargs)``.

    A third-party env library plugs in this way without changes to nnx_ppo;
    the built-in ``gymnax``, ``playground`` and ``brax`` sources are
    registered the same way. ``factory`` returns an
    :class:`~nnx_ppo.envs.types.RLEnv` (or an env that :func:`as_env`
    adapts), and should raise ``ValueError`` for a ``NAME`` it does not know.
    ``make``'s ``random_initial_steps`` and ``random_reset_steps`` (which
    ``nnx-ppo train`` passes for its training env) are not passed to
    ``factory``: when it returns a :class:`~nnx_ppo.envs.wrappers.TimeLimit`,
    ``make`` sets them on that time limit; otherwise they are ignored (an env
    without a time limit has nothing to shorten or desynchronize). Every
    other keyword argument, ``episode_length`` included, goes to ``factory``.

    Args:
      prefix: the part of the spec before ``:``, e.g. ``"navix"``.
      factory: called as ``factory(NAME, **kwargs)``.
      description: one line shown by ``nnx-ppo envs`` and ``nnx-ppo train --help``.
      example: an example spec (``"navix:Empty-5x5"``), or several, listed by
        :func:`list_envs` and ``nnx-ppo envs``.

    Raises:
      ValueError: ``prefix`` is empty, contains ``:`` or is already
        registered (see :func:`unregister_source`), ``factory`` is not
        callable, or an example does not start with ``PREFIX:``.
    """
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"register_source: prefix must be a non-empty string, got {prefix!r}")
    if ":" in prefix:
        raise ValueError(f"register_source: prefix must not contain ':' (give 'navix', not 'navix:'), got {prefix!r}")
    if prefix in _SOURCES:
        raise ValueError(f"register_source: prefix {prefix!r} is already registered "
                         f"(unregister_source({prefix!r}) first to replace it)")
    if not callable(factory):
        raise ValueError(f"register_source: factory must be callable, got {factory!r}")
    examples = () if example is None else (example,) if isinstance(example, str) else tuple(example)
    for spec in examples:
        if not (isinstance(spec, str) and spec.startswith(f"{prefix}:") and len(spec) > len(prefix) + 1):
            raise ValueError(f"register_source: example must be a spec '{prefix}:NAME', got {spec!r}")
    _SOURCES[prefix] = EnvSource(prefix, factory, description, examples)


def unregister_source(prefix: str) -> EnvSource:
    """Remove the source ``prefix`` (e.g. one a test registered); returns it.
    A ``KeyError`` names the registered prefixes if there is no such source."""
    try:
        return _SOURCES.pop(prefix)
    except KeyError:
        raise KeyError(f"no env source {prefix!r}; registered: {', '.join(_SOURCES)}") from None


_ENTRY_POINTS_READ = False


def _read_entry_points() -> None:
    """Register the env sources installed packages declare under
    :data:`ENTRY_POINT_GROUP` (once per process; a prefix registered already
    wins). One that fails to load is skipped with a one-line warning."""
    global _ENTRY_POINTS_READ
    if _ENTRY_POINTS_READ:
        return
    _ENTRY_POINTS_READ = True
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in _SOURCES:
            continue
        try:
            found = point.load()
            if isinstance(found, EnvSource):
                register_source(point.name, found.factory, description=found.description, example=found.examples)
            else:
                summary = ((getattr(found, "__doc__", None) or "").strip().splitlines() or [""])[0]
                register_source(point.name, found, description=summary, example=getattr(found, "examples", None))
        except Exception as e:  # noqa: BLE001 -- a broken plug-in must not break every command
            dist = getattr(point, "dist", None)
            by = f" of the package {dist.name}" if dist is not None else ""
            warnings.warn(f"env source {point.name!r} ({point.value}){by} could not be loaded: "
                          f"{type(e).__name__}: {e}", stacklevel=2)


def list_sources() -> list[EnvSource]:
    """The env sources: built-in ones first, then those registered or
    declared by installed packages (entry points), in registration order."""
    _read_entry_points()
    return list(_SOURCES.values())


def list_envs() -> list[str]:
    """Built-in names, plus example specs of every env source (gymnax, playground, brax, registered ones)."""
    return sorted(_BUILTINS) + [spec for source in list_sources() for spec in source.examples]


def is_own_code(spec: str) -> bool:
    """Whether ``spec`` names the user's own env (``FILE.py:NAME`` or
    ``MODULE:NAME``, a prefix that is no env source) rather than a built-in
    task or a source's env."""
    prefix, sep, _ = spec.partition(":")
    return bool(sep) and _source(prefix) is None


def _source(prefix: str) -> EnvSource | None:
    """The env source ``prefix``, or None; the installed packages' sources
    are read first when it is not registered."""
    if prefix not in _SOURCES:
        _read_entry_points()
    return _SOURCES.get(prefix)


def is_known(spec: str) -> bool:
    """Whether this process can tell what ``spec`` is without building it:
    a built-in or registered name, a source's ``PREFIX:NAME``, or a reference
    to code (which :func:`make` then loads). False for a plain name that
    only the script that registered it knows."""
    return ":" in spec or spec in _BUILTINS


def _missing(extra: str, package: str, err: ImportError) -> ImportError:
    return ImportError(f"{package} is needed for '{extra}:' environments but could not be imported ({err}). "
                       f'Install it with: pip install "nnx_ppo[{extra}]"')


def playground_episode_length(pg_env) -> int:
    """A Playground env's configured ``episode_length`` (default 1000)."""
    cfg = getattr(pg_env, "_config", None)
    return int(cfg.get("episode_length", 1000)) if hasattr(cfg, "get") else 1000


def _as_original_env(env) -> RLEnv | None:
    """``env`` in :class:`~nnx_ppo.envs.adapters.OriginalEnv` (with the
    one-line note) when its reset state is the original nnx-ppo's kind: has
    ``obs``, ``reward`` and ``done`` but is not an
    :class:`~nnx_ppo.envs.types.EnvState`; None otherwise (this library's
    API, or something the env checks will name). The reset is traced, not run."""
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
    from nnx_ppo.envs.adapters import BraxEnv, GymnaxEnv, PlaygroundEnv
    from nnx_ppo.envs.types import RLEnv

    if isinstance(env, RLEnv):
        return env
    if isinstance(env, str):
        return make(env)
    module = type(env).__module__.split(".")[0]
    name = type(env).__name__
    limits = (random_initial_steps, random_reset_steps)
    # a Playground env, or a subclass of one (vnl-playground's, the rodent tasks)
    if any(cls.__module__.split(".")[0] == "mujoco_playground" for cls in type(env).__mro__):
        length = playground_episode_length(env) if episode_length is None else episode_length
        return _time_limit(PlaygroundEnv(env, name), length, *limits)
    if module == "brax":
        return _time_limit(BraxEnv(env, name), 1000 if episode_length is None else episode_length, *limits)
    if module == "gymnax":
        return GymnaxEnv(env)
    if callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        original = _as_original_env(env)
        if original is None:
            return env  # duck-typed: the env checks before training validate it
        return _time_limit(original, episode_length, *limits)
    raise TypeError(f"expected an env with this library's API (an nnx_ppo.envs.RLEnv: reset(key) / step(state, action) "
                    f"returning EnvState with info['truncated']), a MuJoCo Playground, Brax or gymnax env; got {name} "
                    f"from {type(env).__module__}. See docs/environments.md")


def _time_limit(env: RLEnv, episode_length, random_initial_steps: bool = False, random_reset_steps: int = 0) -> RLEnv:
    """``env`` in a :class:`~nnx_ppo.envs.wrappers.TimeLimit` of ``episode_length`` steps (unchanged for None)."""
    from nnx_ppo.envs.wrappers import TimeLimit

    if episode_length is None:
        return env
    return TimeLimit(env, int(episode_length), random_initial_steps, random_reset_steps)


def make(spec: str, **kwargs) -> RLEnv:
    """Build an environment from a spec string.

    * ``"NAME"``: a built-in task (see ``list_envs()``); kwargs go to its
      constructor, except ``episode_length`` (wraps in ``TimeLimit``; built-in
      default: 200 for cartpole_no_velocity, 1000 for constant_reward, 50 for
      limb_reacher, none for cue_memory), ``random_initial_steps`` and
      ``random_reset_steps`` (see :class:`~nnx_ppo.envs.wrappers.TimeLimit`).
    * ``"gymnax:NAME"``: kwargs override gymnax env params (e.g.
      ``max_steps_in_episode=100``), plus ``random_initial_steps`` and
      ``random_reset_steps`` (they add a ``TimeLimit`` at the env's limit).
    * ``"playground:NAME"``: kwargs are Playground config overrides, plus
      ``episode_length`` (default: the config's ``episode_length``, else 1000),
      ``random_initial_steps`` and ``random_reset_steps``. ``impl`` defaults to
      ``"jax"`` (MJX); ``impl="warp"`` selects MuJoCo Warp (see docs/environments.md).
    * ``"brax:NAME"``: kwargs go to ``brax.envs.get_environment``, plus
      ``episode_length`` (default 1000), ``random_initial_steps`` and ``random_reset_steps``.
    * ``"PREFIX:NAME"`` of a source added with :func:`register_source` or
      declared by an installed package (:data:`ENTRY_POINT_GROUP`): kwargs
      go to its factory, except ``random_initial_steps`` and ``random_reset_steps``.
    * ``"path/to/file.py:NAME"`` or ``"package.module:NAME"`` (a prefix that
      is no source): your own env class or function ``NAME``, called with the
      kwargs except ``episode_length`` (wraps in ``TimeLimit``),
      ``random_initial_steps`` and ``random_reset_steps``; it returns an
      :class:`~nnx_ppo.envs.types.RLEnv` (or an env :func:`as_env` adapts).

    For every spec, ``reset_pool=N`` draws resets from a pool of N initial
    states computed once (:class:`~nnx_ppo.envs.wrappers.ResetPool`, under
    the time limit): for training envs whose reset is expensive; and
    ``hide_obs=[i, ...]`` removes those indices of a flat observation's last
    axis (or those keys of a dict observation) from the observations and the
    observation space (:class:`~nnx_ppo.envs.wrappers.ObservationMask`, the
    outermost wrapper): ``make("gymnax:CartPole-v1", hide_obs=[1, 3])`` hides
    the velocities, which makes a memory task of a control task.
    """
    if not isinstance(spec, str):
        raise TypeError(f"make expects a string spec, got {spec!r}")
    env = _make(spec, dict(kwargs))
    # remember which call built env while it lives, for spec_of (one that is not weakly referenceable is not)
    try:
        weakref.finalize(env, _SPECS.pop, id(env), None)
    except TypeError:
        return env
    _SPECS[id(env)] = (normalized(spec), dict(kwargs))
    return env


_SPECS: dict[int, tuple[str, dict[str, Any]]] = {}


def spec_of(env) -> tuple[str, dict[str, Any]] | None:
    """``(spec, kwargs)`` of the :func:`make` call that built ``env`` (so a
    run directory can record how to rebuild it), or None for an env built
    another way."""
    return _SPECS.get(id(env))


def _make(spec: str, kwargs: dict[str, Any]) -> RLEnv:
    from nnx_ppo.envs.wrappers import ObservationMask, ResetPool, TimeLimit

    pool_size = kwargs.pop("reset_pool", None)
    hidden = kwargs.pop("hide_obs", None)
    env = _make_env(spec, kwargs)
    # the pool goes under the time limit, so the limit's random start steps are still drawn at every reset
    if pool_size is not None and isinstance(env, TimeLimit):
        env = TimeLimit(ResetPool(env.env, pool_size), env.max_steps, env.random_initial_steps, env.random_reset_steps)
    elif pool_size is not None:
        env = ResetPool(env, pool_size)
    if hidden is None:
        return env
    # the mask goes outside everything else: make("gymnax:CartPole-v1", hide_obs=[1, 3]) is cart-pole without
    # its velocities, a memory task
    if isinstance(hidden, (str, int)) or not isinstance(hidden, Sequence) or not hidden:
        raise ValueError(f"hide_obs must be a non-empty list of observation indices or keys, got {hidden!r}")
    return ObservationMask(env, hidden)


def _make_env(spec: str, kwargs: dict[str, Any]) -> RLEnv:
    # make's random_initial_steps / random_reset_steps, where given
    reset_options = {key: cast(kwargs.pop(key)) for key, cast in
                     (("random_initial_steps", bool), ("random_reset_steps", int)) if key in kwargs}
    prefix, sep, name = spec.partition(":")

    if not sep:
        if spec not in _BUILTINS:
            close = difflib.get_close_matches(spec, list_envs(), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"Unknown environment {spec!r}{hint}. Available: {', '.join(list_envs())}")
        ctor, default_len = _BUILTINS[spec]
        episode_length = kwargs.pop("episode_length", default_len)
        return _time_limit(ctor(**kwargs), episode_length, **reset_options)

    source = _source(prefix)
    if source is None and name:
        return _make_own(spec, kwargs, reset_options)
    if source is None or not name:
        raise ValueError(f"Unknown environment spec {spec!r}: expected a built-in name, one of the prefixes "
                         f"{', '.join(p + ':' for p in _SOURCES)}, or your own env as FILE.py:NAME or MODULE:NAME. "
                         f"Available: {', '.join(list_envs())}")
    if source.factory is _make_gymnax:  # it adds a time limit for them (gymnax's own ends the episodes otherwise)
        return source.factory(name, **reset_options, **kwargs)
    return _with_reset_options(source.factory(name, **kwargs), reset_options)


def _make_own(spec: str, kwargs: dict[str, Any], reset_options: dict[str, Any]) -> RLEnv:
    """The user's env ``FILE.py:NAME`` or ``MODULE:NAME`` (see :func:`make`).
    A ValueError says in one line what could not be found; a prefix that
    is neither a source nor importable is told apart from a typo of one."""
    try:
        ctor = load(spec, "env", "class or function")
    except ValueError as e:
        prefix, _, name = spec.partition(":")
        if is_file_reference(spec) or "." in prefix:
            raise
        match = difflib.get_close_matches(prefix, list(_SOURCES), n=1, cutoff=0.6)
        close = f" (did you mean '{match[0]}:{name}'?)" if match else ""
        why = f" ({str(e).partition(': ')[2]})" if name.isidentifier() else ""
        raise ValueError(f"Unknown environment spec {spec!r}{close}: {prefix!r} is neither an env source "
                         f"({', '.join(p + ':' for p in _SOURCES)}) nor a module of your own{why}; install the "
                         "package that provides it, or name your env as FILE.py:NAME") from None
    if not callable(ctor):
        raise ValueError(f"env {spec!r} names {type(ctor).__name__} {ctor!r}, not an env class or function")
    episode_length = kwargs.pop("episode_length", None)
    return _with_reset_options(ctor(**kwargs), reset_options, episode_length)


def _with_reset_options(env, reset_options: dict[str, Any], episode_length: int | None = None) -> RLEnv:
    """A source's or the user's env, adapted by :func:`as_env` (in a
    ``TimeLimit`` of ``episode_length`` steps where given); ``make``'s
    ``random_initial_steps`` / ``random_reset_steps`` set on it when it is a
    ``TimeLimit`` (otherwise there is nothing to set them on)."""
    from nnx_ppo.envs.wrappers import TimeLimit

    env = _time_limit(as_env(env), episode_length)
    if reset_options and isinstance(env, TimeLimit):
        options = {"random_initial_steps": env.random_initial_steps, "random_reset_steps": env.random_reset_steps}
        return TimeLimit(env.env, env.max_steps, **{**options, **reset_options})
    return env


def _unknown_name(source: str, name: str, library: str, names, available: str = "Available") -> ValueError:
    """The error for a ``name`` the library behind the source ``source`` does not have."""
    spec = f"{source}:{name}"
    return ValueError(f"Unknown environment {spec!r}: {library} has no {name!r}. {available}: {', '.join(names)}")


def _make_gymnax(name: str, *, random_initial_steps: bool = False, random_reset_steps: int = 0, **kwargs) -> RLEnv:
    import gymnax

    from nnx_ppo.envs.adapters import GymnaxEnv

    if name not in gymnax.registered_envs:
        raise _unknown_name("gymnax", name, "gymnax", gymnax.registered_envs, "Available gymnax envs")
    episode_length = kwargs.pop("episode_length", None)
    if episode_length is not None:
        kwargs["max_steps_in_episode"] = int(episode_length)
    env = GymnaxEnv(name, **kwargs)
    # a TimeLimit at the env's own limit, only for make's random start steps
    length = env.params.max_steps_in_episode if random_initial_steps or random_reset_steps else None
    return _time_limit(env, length, random_initial_steps, random_reset_steps)


def _make_playground(name: str, **kwargs) -> RLEnv:
    try:
        from mujoco_playground import registry as pg_registry
    except ImportError as e:
        raise _missing("playground", "mujoco_playground", e) from e
    from nnx_ppo.envs.adapters import PlaygroundEnv

    if name not in pg_registry.ALL_ENVS:
        raise _unknown_name("playground", name, "MuJoCo Playground", pg_registry.ALL_ENVS)
    episode_length = kwargs.pop("episode_length", None)
    pg_env = pg_registry.load(name, config_overrides={"impl": "jax", **kwargs})
    if episode_length is None:
        episode_length = playground_episode_length(pg_env)
    return _time_limit(PlaygroundEnv(pg_env, name), episode_length)


def _make_brax(name: str, **kwargs) -> RLEnv:
    try:
        import brax.envs as brax_envs
    except ImportError as e:
        raise _missing("brax", "brax", e) from e
    from nnx_ppo.envs.adapters import BraxEnv

    if name not in brax_envs._envs:  # noqa: SLF001 -- brax exposes no public listing
        raise _unknown_name("brax", name, "brax", sorted(brax_envs._envs))
    episode_length = kwargs.pop("episode_length", 1000)
    return _time_limit(BraxEnv(brax_envs.get_environment(name, **kwargs), name), episode_length)


register_source(
    "gymnax", _make_gymnax,
    description="a gymnax env; kwargs override its env params (episode_length: max_steps_in_episode)",
    example=["gymnax:CartPole-v1", "gymnax:Pendulum-v1", "gymnax:Acrobot-v1", "gymnax:MountainCarContinuous-v0",
             "gymnax:MemoryChain-bsuite"],
)
register_source(
    "playground", _make_playground,
    description='a MuJoCo Playground env; kwargs are config overrides (pip install "nnx_ppo[playground]")',
    example=["playground:CartpoleBalance", "playground:PendulumSwingup", "playground:CheetahRun"],
)
register_source(
    "brax", _make_brax,
    description='a Brax env; kwargs go to brax.envs.get_environment (pip install "nnx_ppo[brax]")',
    example=["brax:inverted_pendulum", "brax:ant", "brax:halfcheetah"],
)

# ----------------------------------------------------------------------------- the user's own code

SOURCE_DIR = "source"
"""The run directory's folder that holds copies of the user's files."""

# reference -> the file to load instead (a run's copy of a file that moved or changed)
_REDIRECTS: dict[str, Path] = {}


def is_file_reference(ref: str) -> bool:
    """Whether ``ref`` is ``FILE.py:NAME``."""
    return isinstance(ref, str) and ref.rpartition(":")[0].endswith(".py")


def normalized(ref: str) -> str:
    """``ref`` with a file path made absolute (so the run can be read from another directory)."""
    if is_file_reference(ref):
        where, _, name = ref.rpartition(":")
        return f"{os.path.abspath(where)}:{name}"
    return ref


def short_name(ref: str) -> str:
    """``NAME`` of a ``FILE.py:NAME`` reference (for a run directory's name); anything else as it is."""
    return ref.rpartition(":")[2] if is_file_reference(ref) else ref


def _load_file(path: Path, ref: str, what: str):
    """The module of the Python file ``path``, run once per process (every
    seed's objects must come from the same classes)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"nnx_ppo_user_{digest}_{path.stem}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        sys.path.insert(0, str(path.parent))  # its sibling modules import as when it runs as a script
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's file failed to run: say where, in one line
            del sys.modules[module_name]
            raise ValueError(f"{what} {ref!r}: running {path} failed: {type(e).__name__}: {e}") from None
        finally:
            sys.path.remove(str(path.parent))
    return module


def _import(module_name: str, ref: str, what: str):
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would find it
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} {ref!r}: cannot import {module_name} ({e})") from None
    except Exception as e:
        raise ValueError(f"{what} {ref!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None


def load(ref: str, what: str = "reference", kind: str = "") -> Any:
    """What ``ref`` names: ``NAME`` in ``package.module`` (importable, or found
    from the current directory) or in ``path/to/file.py`` (the run's copy of
    it instead, after :func:`use_run_copies` chose it). A ValueError says in
    one line, starting with ``what`` and ``ref``, what could not be found
    (``kind``, e.g. "function", names what ``NAME`` should be)."""
    where, _, name = ref.rpartition(":")
    if not where or not name.isidentifier():
        raise ValueError(f"{what} {ref!r}: expected MODULE:NAME or FILE.py:NAME")
    redirect = _REDIRECTS.get(ref)
    if redirect is not None:
        module = _load_file(redirect, ref, what)
    elif where.endswith(".py"):
        path = Path(os.path.abspath(where))
        if not path.is_file():
            raise ValueError(f"{what} {ref!r}: no file {path}")
        module = _load_file(path, ref, what)
    else:
        module = _import(where, ref, what)
    if not hasattr(module, name):
        raise ValueError(f"{what} {ref!r}: {where} has no {kind + ' ' if kind else ''}{name!r}")
    return getattr(module, name)


def file_of(ref: str) -> Path | None:
    """The Python file behind ``ref`` (a module's file found without running
    it), or None where there is none (a built-in or namespace module)."""
    where = ref.rpartition(":")[0]
    if where.endswith(".py"):
        path = Path(os.path.abspath(where))
        return path if path.is_file() else None
    try:
        spec = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(refs: list[str], run_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """Copy the file behind each reference of ``refs`` into ``run_dir/source/``
    and return ``{ref: {"file": absolute path, "copy": "source/NAME.py",
    "sha256": hash}}`` for ``config.json``. A reference with no file (a
    built-in module) is left out; one file named by two references is copied once."""
    out: dict[str, dict[str, str]] = {}
    copies: dict[Path, str] = {}
    target = Path(run_dir) / SOURCE_DIR
    for ref in dict.fromkeys(refs):
        path = file_of(ref)
        if path is None:
            continue
        if path not in copies:
            name, n = path.name, 1
            while (target / name).exists() and _sha256(target / name) != _sha256(path):
                n += 1
                name = f"{path.stem}_{n}{path.suffix}"
            target.mkdir(parents=True, exist_ok=True)
            if not (target / name).exists():
                shutil.copy2(path, target / name)
            copies[path] = f"{SOURCE_DIR}/{name}"
        out[ref] = {"file": str(path), "copy": copies[path], "sha256": _sha256(path)}
    return out


def use_run_copies(run_dir: str | os.PathLike, recorded: dict[str, Any], current: bool = False) -> list[str]:
    """Check the files a run's references were trained with (``recorded``,
    what :func:`snapshot` returned, from ``config.json``) and return one line
    for each that moved or changed since. For those, :func:`load` uses the
    run's copy from now on, unless ``current`` (then the file as it is now,
    where it still exists)."""
    notes = []
    for ref, entry in (recorded or {}).items():
        if not isinstance(entry, dict) or not {"file", "copy", "sha256"} <= set(entry):
            continue
        copy = Path(run_dir) / entry["copy"]
        _REDIRECTS.pop(ref, None)
        path = file_of(ref)
        if path is not None and path.is_file() and _sha256(path) == entry["sha256"]:
            continue
        what = (f"{entry['file']} has changed since the run was trained" if path is not None
                else f"{entry['file']} no longer exists")
        if current and path is not None:
            notes.append(f"{what}; using it as it is now (--current-code)")
            continue
        if not copy.is_file():
            notes.append(f"{what}, and the run's copy {copy} is missing too")
            continue
        _REDIRECTS[ref] = copy.resolve()
        hint = "; --current-code uses the file as it is now" if path is not None else ""
        notes.append(f"{what}; using the run's copy {copy}{hint}")
    return notes
