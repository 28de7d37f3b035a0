"""Running a policy for whole episodes: evaluation, videos and activation recording.

One stepper, :func:`run_episodes`, serves the periodic evaluation in
training, :func:`evaluate` and video recording (with
``record_states``): a compiled scan over steps, one episode per env. Its two
pieces, :func:`start_episodes` and :func:`policy_step`, also step
:func:`record_activations`.

*Activation recording* (:func:`record_activations`): what chosen modules of a
network compute over an evaluation rollout, as ``[T, B, ...]`` arrays with
episode boundaries.

::

    paths = module_paths(network)       # e.g. 'layers/1/components/action/layers/1'
    rec = record_activations(env, network, [paths[3]], n_envs=4, n_steps=200)
    rec.activations[path]                # the module's output at every step, [T, B, ...]
    rec.carries[path]                    # the carry it returned,             [T, B, ...]
    rec.episode_start, rec.done          # episode boundaries,                [T, B]
    rec.save("activations.npz"); Recording.load("activations.npz")

How it works: the network's functional view is merged into a private copy,
and in that copy each chosen module is replaced by a small wrapper that calls
it unchanged and keeps its output and carry in a variable of its own. One
jitted ``lax.scan`` steps the envs with the copy (the steps of
:func:`run_episodes`, restarting ended
episodes as training rollouts do) and reads the wrappers' variables after
every step. The user's network is never modified, and nothing in the
library's modules or training programs knows about recording.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.ppo import reset_ended, sum_leaves
from nnx_ppo.networks.recording import Recorder
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, select_where

__all__ = ["run_episodes", "evaluate", "episode_metrics", "Recording", "module_paths", "record_activations"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Episodes:
    """What :func:`run_episodes` returns.

    Attributes:
      returns: ``[N]`` return of each env's first episode (summed reward keys).
      lengths: ``[N]`` its length in steps (``max_steps`` if it did not end).
      states: with ``record_states``, the env states ``[max_steps + 1, N, ...]``
        (the reset state first); ``None`` otherwise.
    """

    returns: jax.Array
    lengths: jax.Array
    states: Any = None


def start_episodes(env, network: NetworkFn, key: jax.Array, n_envs: int) -> tuple[Any, Any, NetworkFn]:
    """Reset ``n_envs`` envs (one key each, split from ``key``) and build the
    network's fresh carry (traceable).

    Returns ``(env_state, carry, network)``: env states and carry with leaves
    ``[n_envs, ...]``, and the network view after ``initialize``.
    """
    carry, network = network.initialize(n_envs)
    env_state = jax.vmap(env.reset)(jax.random.split(key, n_envs))
    return env_state, carry, network


def policy_step(env, network: NetworkFn, env_state: Any, carry: Any) -> tuple[StatefulModuleOutput, Any, NetworkFn]:
    """One step of acting (traceable): the network acts on ``env_state.obs``
    and every env steps with its action. Ended envs are not reset here.

    Returns ``(out, stepped, network)``: the network's output
    (``out.output`` a :class:`~nnx_ppo.networks.types.PPONetworkOutput`,
    ``out.next_state`` the carry after the step), the stepped env states
    ``[B, ...]`` and the network view after ``apply``.
    """
    out, network = network.apply(carry, env_state.obs)
    stepped = jax.vmap(env.step)(env_state, out.output.actions)
    return out, stepped, network


def run_episodes(env, network: NetworkFn, key: jax.Array, n_envs: int, max_steps: int,
                 record_states: bool = False) -> Episodes:
    """Reset ``n_envs`` envs and step them with ``network`` for ``max_steps``
    steps (traceable; jit it). Each env's first episode is measured; steps
    after it ended are not counted (an ended env may hold NaN)."""
    env_state, carry, network = start_episodes(env, network, key, n_envs)

    def step(c, _):
        network, env_state, carry, ret, length, alive = c
        out, env_state, network = policy_step(env, network, env_state, carry)
        ret = ret + jnp.where(alive > 0, sum_leaves(env_state.reward), 0.0)
        length = length + alive
        alive = alive * (1.0 - (env_state.done > 0))
        return (network, env_state, out.next_state, ret, length, alive), (env_state if record_states else None)

    zeros = jnp.zeros((n_envs,), jnp.float32)
    init = (network, env_state, carry, zeros, zeros, jnp.ones((n_envs,), jnp.float32))
    (_, _, _, ret, length, _), states = jax.lax.scan(step, init, None, length=max_steps)
    if record_states:
        states = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), env_state, states)
    return Episodes(returns=ret, lengths=length, states=states)


def episode_metrics(episodes: Episodes) -> dict[str, jax.Array]:
    """``eval/episode_return`` (mean), its std/min/max and ``eval/episode_length``."""
    ret = episodes.returns
    return {
        "eval/episode_return": jnp.mean(ret),
        "eval/episode_return_std": jnp.std(ret),
        "eval/episode_return_min": jnp.min(ret),
        "eval/episode_return_max": jnp.max(ret),
        "eval/episode_length": jnp.mean(episodes.lengths),
    }


def evaluate(env, network, *, n_envs: int = 16, max_episode_length: int = 1000, seed: int = 0,
             deterministic: bool = True) -> dict[str, float]:
    """Run ``n_envs`` episodes with ``network`` (an NNX module; mode/mean
    actions when ``deterministic``) and return return/length statistics."""
    fn = jax.jit(lambda network, key: episode_metrics(run_episodes(env, network, key, n_envs, max_episode_length)))
    metrics = fn(NetworkFn.of(network, deterministic), jax.random.key(seed))
    return {k: float(v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------- activation recording


_FORMAT = "nnx_ppo.recording/1"
_STRUCTURE_KEY = "__recording__"


# ----------------------------------------------------------------------------- module paths


def _path_str(path: tuple) -> str:
    """An nnx path tuple as a '/'-joined string: ``('layers', 1)`` -> ``'layers/1'``."""
    return "/".join(str(part) for part in path)


def _path_order(path: tuple) -> list:
    """Sort key: parents before children, list indices in numeric order."""
    return [(0, part) if isinstance(part, int) else (1, str(part)) for part in path]


def _recordable(network: nnx.Module) -> dict[str, tuple]:
    """``{'/'-joined path: nnx path}`` of every :class:`StatefulModule` below
    the root, parents before their children."""
    found = [tuple(path) for path, m in nnx.iter_modules(network) if path and isinstance(m, StatefulModule)]
    return {_path_str(path): path for path in sorted(found, key=_path_order)}


def module_paths(network: nnx.Module) -> list[str]:
    """The paths of the modules of ``network`` that can be recorded.

    Every :class:`~nnx_ppo.networks.types.StatefulModule` below the root
    (containers and layers), as its NNX path joined with ``'/'``, parents
    before children; e.g. ``'layers/1/components/action/layers/1'`` is the
    LSTM of the action port of ``make_recurrent_actor_critic``'s network.
    """
    if not isinstance(network, StatefulModule):
        raise TypeError(f"module_paths: network must be a StatefulModule, got {type(network).__name__}")
    return list(_recordable(network))


def _check_paths(network: nnx.Module, paths: Any) -> list[str]:
    """``paths`` as a list of known, distinct paths (one string is one path).

    Raises:
      TypeError: a path is not a string.
      ValueError: ``paths`` is empty, or a path is not in :func:`module_paths`
        (the message lists the valid ones).
    """
    known = _recordable(network)
    if isinstance(paths, str):
        paths = [paths]
    chosen: dict[str, None] = {}  # insertion-ordered, without repeats
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"record_activations: paths must be strings like 'layers/0', got {path!r}")
        path = path.strip("/")
        if path not in known:
            raise ValueError(f"record_activations: unknown module path {path!r}; recordable paths are: "
                             + ", ".join(repr(p) for p in known))
        chosen[path] = None
    if not chosen:
        raise ValueError("record_activations: paths is empty; expected at least one of: "
                         + ", ".join(repr(p) for p in known))
    return list(chosen)


# ----------------------------------------------------------------------------- the recording copy


class _Captured(nnx.Variable):
    """A recorded module's ``(output, next_state)`` of the current step
    (``None`` between steps). Never read by the forward pass."""


class _Recorder(Recorder):
    """Calls ``wrapped`` unchanged and keeps its output and carry in
    :class:`_Captured` (instead of the metrics, as :class:`Recorder` does;
    the carry, resets and statistics are forwarded by it). Exists only in the
    private copy that :func:`record_activations` builds."""

    def __init__(self, wrapped: StatefulModule, path: str):
        super().__init__(wrapped)
        self.path = path
        self.captured = _Captured(None)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.wrapped(state, x, rollout_extras)
        self.captured.set_value((out.output, out.next_state))
        return out

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        return self.wrapped.replay_sequence(carry, xs, rollout_extras, reset, stored_carry)


def _is_mapping(node: Any) -> bool:
    return isinstance(node, (Mapping, nnx.Dict))


def _child(node: Any, key: Any) -> Any:
    """``node``'s child under one nnx path key (an item or an attribute)."""
    return node[key] if isinstance(key, int) or _is_mapping(node) else getattr(node, key)


def _replace_child(root: nnx.Module, path: tuple, new: StatefulModule) -> None:
    """Put ``new`` where the module at ``path`` was (``path`` non-empty)."""
    parent = functools.reduce(_child, path[:-1], root)
    key = path[-1]
    try:
        if isinstance(key, int) or _is_mapping(parent):
            parent[key] = new
        else:
            setattr(parent, key, new)
    except (TypeError, AttributeError) as e:
        raise ValueError(f"record_activations: cannot record {_path_str(path)!r}: its parent "
                         f"{type(parent).__name__} does not allow replacing a child ({e})") from None


def _recording_view(network: nnx.Module, paths: list[str], deterministic: bool) -> NetworkFn:
    """A functional view of a copy of ``network`` whose modules at ``paths``
    are wrapped in :class:`_Recorder`. ``network`` itself is not modified."""
    copy = NetworkFn.of(network, deterministic).module()  # fresh module objects, same arrays
    known = _recordable(copy)
    # Deepest first: wrapping a module changes the paths below it.
    for path in sorted(paths, key=lambda p: len(known[p]), reverse=True):
        _replace_child(copy, known[path], _Recorder(functools.reduce(_child, known[path], copy), path))
    return NetworkFn.of(copy)


def _take_captured(network: NetworkFn) -> tuple[NetworkFn, dict[str, tuple[Any, Any]]]:
    """The recorders' ``{path: (output, next_state)}`` of the step just run,
    and the view with every :class:`_Captured` back to ``None`` (so the view
    keeps one structure from step to step)."""
    module = network.module()
    captured = {}
    for _, m in nnx.iter_modules(module):
        if isinstance(m, _Recorder):
            value = m.captured.get_value()
            if value is None:
                raise ValueError(f"record_activations: module {m.path!r} was not called during a step of "
                                 "the network, so it has nothing to record")
            captured[m.path] = value
            m.captured.set_value(None)
    _, _, rest = nnx.split(module, nnx.Param, ...)
    return network.with_state(rest=rest), captured


def _record_scan(env, network: NetworkFn, key: jax.Array, n_envs: int, n_steps: int) -> dict[str, Any]:
    """Step ``n_envs`` envs ``n_steps`` times with the recording view
    (traceable; jit it). Envs start as in ``run_episodes`` (same ``key``, so
    every env's first episode is the one :func:`~nnx_ppo.algorithms.evaluation.evaluate`
    measures); an ended episode restarts at the next step, env and carry, as
    in training rollouts. Returns ``[T, B, ...]`` leaves."""
    env_state, carry, network = start_episodes(env, network, key, n_envs)

    def step(c, reset_key):
        network, env_state, carry = c
        out, stepped, network = policy_step(env, network, env_state, carry)
        network, captured = _take_captured(network)
        done = stepped.done > 0
        fresh, network = network.reset(out.next_state)
        next_c = (network, reset_ended(env, done, stepped, reset_key), select_where(done, fresh, out.next_state))
        record = dict(observations=env_state.obs, actions=out.output.actions, rewards=stepped.reward, done=done,
                      captured=captured)
        return next_c, record

    reset_keys = jax.random.split(jax.random.fold_in(key, 1), n_steps)
    _, records = jax.lax.scan(step, (network, env_state, carry), reset_keys)
    records["episode_start"] = jnp.concatenate([jnp.ones((1, n_envs), bool), records["done"][:-1]], axis=0)
    return records


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"record_activations: {name} must be a positive int, got {value!r}")
    return int(value)


def record_activations(env, network: StatefulModule, paths: str | Iterable[str], *, n_envs: int = 8,
                       n_steps: int = 1000, seed: int = 0, deterministic: bool = True) -> "Recording":
    """Run ``network`` on ``env`` and record what the modules at ``paths`` compute.

    ``n_envs`` envs are reset with ``seed`` exactly as
    :func:`~nnx_ppo.algorithms.evaluation.evaluate` resets them, and stepped
    ``n_steps`` times in one compiled scan; an env whose episode ended starts
    a new episode (fresh env state and carry) at the next step. The network
    is not modified.

    Args:
      env: an :class:`~nnx_ppo.envs.types.RLEnv`.
      network: a PPO network (a :class:`StatefulModule` whose output is a
        :class:`~nnx_ppo.networks.types.PPONetworkOutput`).
      paths: module paths from :func:`module_paths` (one string for one path).
      n_envs: envs run in parallel, ``B``.
      n_steps: steps recorded, ``T``.
      seed: seeds the env resets.
      deterministic: mode/mean actions and noise layers off (as in
        evaluation); ``False`` samples as in training.

    Returns:
      A :class:`Recording` with ``[T, B, ...]`` arrays (numpy, or JAX key
      arrays for PRNG keys in carries).

    Raises:
      ValueError: an unknown path (the message lists the valid ones), no
        path, or a non-positive ``n_envs``/``n_steps``.
    """
    if not isinstance(network, StatefulModule):
        raise TypeError(f"record_activations: network must be a StatefulModule, got {type(network).__name__}")
    chosen = _check_paths(network, paths)
    n_envs, n_steps = _positive_int("n_envs", n_envs), _positive_int("n_steps", n_steps)
    view = _recording_view(network, chosen, deterministic)
    run = jax.jit(functools.partial(_record_scan, env, n_envs=n_envs, n_steps=n_steps))
    records = jax.device_get(run(view, jax.random.key(seed)))
    captured = records["captured"]
    return Recording(
        activations={path: captured[path][0] for path in chosen},
        carries={path: captured[path][1] for path in chosen if jax.tree.leaves(captured[path][1])},
        observations=records["observations"],
        actions=records["actions"],
        rewards=records["rewards"],
        done=np.asarray(records["done"]),
        episode_start=np.asarray(records["episode_start"]),
    )


# ----------------------------------------------------------------------------- the result


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recording:
    """Activations recorded by :func:`record_activations`; every array is
    ``[T, B, ...]`` (``T`` steps, ``B`` envs).

    Attributes:
      activations: ``{path: output}``, each recorded module's output at every
        step (an array, or a pytree of them, e.g. a sampler's dict).
      carries: ``{path: carry}``, the carry each recorded module returned at
        every step (before any episode reset); modules without carry are absent.
      observations: what the network saw at each step.
      actions: the actions it took.
      rewards: the rewards of those steps (a pytree when the env's are).
      done: ``[T, B]`` bool, the episode ended with step ``t`` (the env and
        the carry restart at ``t + 1``).
      episode_start: ``[T, B]`` bool, step ``t`` is the first of an episode
        (``t = 0``, or the episode ended at ``t - 1``).
    """

    activations: dict[str, Any]
    carries: dict[str, Any]
    observations: Any
    actions: Any
    rewards: Any
    done: np.ndarray
    episode_start: np.ndarray

    def __repr__(self) -> str:
        shapes = lambda tree: jax.tree.map(lambda x: tuple(getattr(x, "shape", ())), tree)
        n_steps, n_envs = self.done.shape
        return (f"Recording(T={n_steps}, B={n_envs}, episodes_ended={int(self.done.sum())}, "
                f"activations={shapes(self.activations)}, carries={shapes(self.carries)})")

    def episodes(self, env: int) -> list[slice]:
        """The steps of env ``env``'s episodes as slices of the time axis
        (the last one may be cut off by the end of the recording)."""
        n_envs = self.done.shape[1]
        if not 0 <= env < n_envs:
            raise ValueError(f"Recording.episodes: env must be in [0, {n_envs}), got {env}")
        starts = np.flatnonzero(self.episode_start[:, env])
        stops = [*starts[1:], self.done.shape[0]]
        return [slice(int(a), int(b)) for a, b in zip(starts, stops)]

    def save(self, path: str | Path) -> None:
        """Write to ``path`` (a ``.npz`` file): one array per leaf under a
        '/'-joined key (``'activations/<module path>'``, with the leaf's keys
        appended for pytrees, e.g. ``'carries/<module path>/h'``), plus the
        tree structure that :meth:`load` rebuilds."""
        path = Path(path)
        if path.suffix != ".npz":
            raise ValueError(f"Recording.save: path must end in .npz, got {str(path)!r}")
        arrays: dict[str, np.ndarray] = {}
        structure = {f.name: _encode(getattr(self, f.name), f.name, arrays) for f in dataclasses.fields(self)}
        arrays[_STRUCTURE_KEY] = np.asarray(json.dumps({"format": _FORMAT, "fields": structure}))
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "Recording":
        """Read a file written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as data:
            if _STRUCTURE_KEY not in data:
                raise ValueError(f"Recording.load: {str(path)!r} was not written by Recording.save "
                                 f"(no {_STRUCTURE_KEY!r} entry)")
            header = json.loads(str(data[_STRUCTURE_KEY]))
            if header.get("format") != _FORMAT:
                raise ValueError(f"Recording.load: {str(path)!r} has format {header.get('format')!r}, "
                                 f"expected {_FORMAT!r}")
            fields = {f.name: _decode(header["fields"][f.name], data) for f in dataclasses.fields(cls)}
        return cls(**fields)


# ----------------------------------------------------------------------------- .npz encoding


def _encode(tree: Any, key: str, arrays: dict[str, np.ndarray]) -> Any:
    """Store the leaves of ``tree`` in ``arrays`` under ``key/...`` and return
    a JSON description of its structure (dicts, lists, tuples, ``None``;
    dataclasses are stored as dicts of their fields)."""
    if tree is None:
        return None
    if isinstance(tree, Mapping):
        return {"dict": [[k, _encode(v, f"{key}/{k}", arrays)] for k, v in _json_keys(tree, key)]}
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        return {kind: [_encode(v, f"{key}/{i}", arrays) for i, v in enumerate(tree)]}
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
        return _encode(fields, key, arrays)
    if key in arrays:
        raise ValueError(f"Recording.save: two leaves would be stored under the key {key!r}")
    if hasattr(tree, "dtype") and jnp.issubdtype(tree.dtype, jax.dtypes.prng_key):
        arrays[key] = np.asarray(jax.random.key_data(tree))
        return {"key": key, "impl": str(jax.random.key_impl(tree))}
    arrays[key] = np.asarray(tree)
    return {"array": key}


def _json_keys(tree: Mapping, where: str) -> list[tuple[Any, Any]]:
    """The items of a dict whose keys JSON can hold (str, int)."""
    for k in tree:
        if not isinstance(k, (str, int)) or isinstance(k, bool):
            raise TypeError(f"Recording.save: dict key {k!r} under {where!r} is not a str or int")
    return list(tree.items())


def _decode(node: Any, data: Any) -> Any:
    """Rebuild what :func:`_encode` described from the loaded arrays."""
    if node is None:
        return None
    if "dict" in node:
        return {k: _decode(v, data) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, data) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, data) for v in node["tuple"])
    if "key" in node:
        return jax.random.wrap_key_data(data[node["key"]], impl=node["impl"])
    return data[node["array"]]
