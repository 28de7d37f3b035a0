"""A trained policy to load, step and export.

:func:`load_policy` reads a run (or one checkpoint) and gives a
:class:`Policy`: a compiled step that carries the network's state from call
to call and resets it where an episode ended, exactly as training does::

    import nnx_ppo

    policy = nnx_ppo.load_policy("runs/cartpole", step="best")
    carry = policy.initial_carry(n)           # n envs
    done = None                               # no episode has ended yet
    for t in range(T):
        action, carry = policy(carry, obs, done)
        obs, done = ...                       # step your envs; done: [n] bool

``done[i]`` says that env ``i``'s previous step ended its episode, so
``obs[i]`` is the first observation of a new one: the policy resets that
env's carry (``reset_state``) before acting, as the training rollout does
after every ended step.

:meth:`Policy.export` writes the step as a serialized :mod:`jax.export`
artifact that runs with JAX alone (no nnx_ppo, no Flax): see
:func:`load_exported`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.algorithms.functional import NetworkFn, copy_leaf
from nnx_ppo.networks.replay import select_where

__all__ = ["Policy", "load_policy", "ExportedPolicy", "load_exported"]

_STEP_FILE = "step.jax"
_INIT_FILE = "initial_carry.jax"
_INFO_FILE = "policy.json"
_PARAMS_FILE = "params.npz"


def _act(network: NetworkFn, carry: Any, obs: Any, done: jax.Array | None) -> tuple[Any, Any]:
    """One step as the training rollout takes it. ``carry`` is ``(state,
    fresh, variables)``: the network carry, the carry a reset would give
    (computed after every step, as the rollout does), and the network's
    non-parameter variables (its random streams). Where ``done`` the fresh
    carry is taken; then the network acts on ``obs`` ``[B, ...]``. Returns
    ``(actions, next carry)``."""
    state, fresh, rest = carry
    if done is not None:
        state = select_where(done, fresh, state)
    out, network = network.with_state(rest=rest).apply(state, obs)
    fresh, network = network.reset(out.next_state)
    return out.output.actions, (out.next_state, fresh, network.rest)


def _initial(network: NetworkFn, n: int) -> tuple[Any, Any, Any]:
    """The policy carry of ``n`` fresh envs."""
    state, network = network.initialize(n)
    return state, state, network.rest


class Policy:
    """A trained network as a compiled step ``(carry, obs, done) -> (action, carry)``.

    Build one with :func:`load_policy` or ``Policy(network)`` (an NNX
    actor-critic; its variables are copied, the module is left as it is).
    Deterministic policies take the mode (mean) action; with
    ``deterministic=False`` actions are sampled.

    The carry holds what the next step needs: the network's carry (leaves
    ``[n, ...]``), the carry a reset would give, and the network's random
    streams (what a sampler, or a module drawing fresh keys on reset, draws
    from). A policy is a pure function of its carry: the same carry and
    observations give the same actions, and ``done=None`` is the same as
    ``done`` all False.
    """

    def __init__(self, network: Any, deterministic: bool = True):
        self.deterministic = bool(deterministic)
        view = NetworkFn.of(network, self.deterministic)
        self._network = jax.tree.map(copy_leaf, view)
        self._step = jax.jit(_act)
        self._init = jax.jit(_initial, static_argnums=1)

    def initial_carry(self, n: int) -> Any:
        """The carry of ``n`` envs at the start of their episodes."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"Policy.initial_carry: n must be a positive int (the number of envs), got {n!r}")
        return self._init(self._network, n)

    def __call__(self, carry: Any, obs: Any, done: Any = None) -> tuple[Any, Any]:
        """Act on ``obs`` (leaves ``[n, ...]``) from ``carry``; where ``done``
        (``[n]`` bool; None: nowhere) the carry is reset first. Returns
        ``(action, next carry)``."""
        done = None if done is None else jnp.asarray(done, bool)
        return self._step(self._network, carry, obs, done)

    def export(self, path: str | os.PathLike, obs: Any, platforms: tuple[str, ...] | None = None) -> pathlib.Path:
        """Write the policy's step for a batch shaped like ``obs`` as a
        :mod:`jax.export` artifact in the directory ``path`` (created).

        The artifact is the parameters and the step compiled together: it
        needs JAX only (:func:`load_exported`). ``obs`` is an example
        observation batch (arrays or ``jax.ShapeDtypeStruct``, ``[n, ...]``);
        the exported step takes exactly that batch size. ``platforms``
        (default: the current backend) are the ones it runs on, e.g.
        ``("cpu", "cuda")``. The exported carry is a flat list of arrays
        (random keys as their ``uint32`` data).
        """
        obs_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), obs)
        n = _batch_size(obs_spec)
        params, params_def = jax.tree.flatten(self._network.params)
        rest, rest_def = jax.tree.flatten(self._network.rest)
        graphdef = self._network.graphdef

        def network(params):  # the parameters come in as arguments, as in the live step
            return NetworkFn(graphdef, jax.tree.unflatten(params_def, params), jax.tree.unflatten(rest_def, rest))

        leaves, carry_def = jax.tree.flatten(self.initial_carry(n))
        key_impls = [jax.random.key_impl(x) if _is_key(x) else None for x in leaves]

        def to_data(tree):  # typed PRNG keys cross the boundary as their uint32 data
            return [jax.random.key_data(x) if impl is not None else x
                    for x, impl in zip(jax.tree.leaves(tree), key_impls)]

        def from_data(data):
            return jax.tree.unflatten(carry_def, [jax.random.wrap_key_data(x, impl=impl) if impl is not None else x
                                                  for x, impl in zip(data, key_impls)])

        def initial_carry(params):
            return to_data(_initial(network(params), n))

        def step(params, carry_data, obs, done):
            action, carry = _act(network(params), from_data(carry_data), obs, done)
            return action, to_data(carry)

        params_spec = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in params]
        carry_spec = jax.eval_shape(initial_carry, params_spec)
        done_spec = jax.ShapeDtypeStruct((n,), jnp.bool_)
        platforms = tuple(platforms or (jax.default_backend(),))
        exported_step = jax.export.export(jax.jit(step), platforms=platforms)(params_spec, carry_spec, obs_spec,
                                                                              done_spec)
        exported_init = jax.export.export(jax.jit(initial_carry), platforms=platforms)(params_spec)
        out = pathlib.Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / _STEP_FILE).write_bytes(exported_step.serialize())
        (out / _INIT_FILE).write_bytes(exported_init.serialize())
        np.savez(out / _PARAMS_FILE, *[np.asarray(x) for x in params])
        info = {
            "format": "nnx-ppo exported policy 1",
            "batch_size": n,
            "deterministic": self.deterministic,
            "platforms": list(platforms),
            "carry_leaves": len(carry_spec),
            "params": len(params),
            "usage": "params = [np.load('params.npz')[f'arr_{i}'] for i in range(params)]; "
                     "carry = initial_carry.call(params); action, carry = step.call(params, carry, obs, done)",
        }
        (out / _INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        return out


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _batch_size(obs: Any) -> int:
    sizes = {x.shape[0] if x.shape else None for x in jax.tree.leaves(obs)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"Policy.export: obs must be a batch with one leading size [n, ...], got shapes "
                         f"{[x.shape for x in jax.tree.leaves(obs)]}")
    return sizes.pop()


def load_policy(run_or_checkpoint: str | os.PathLike, step: int | str | None = None, seed: int | None = None,
                *, member: int | None = None, network: Any = None, deterministic: bool = True) -> Policy:
    """The :class:`Policy` of a trained run.

    Args:
      run_or_checkpoint: a run directory of ``nnx-ppo train``, its
        ``checkpoints/`` directory, or one checkpoint in it.
      step: the latest checkpoint (None), the best evaluated policy
        (``"best"``), or the one saved at env step N.
      seed: for a run of several seeds trained together, which one.
      member: for a population (``nnx-ppo sweep``, ``train_population``),
        which member (``0 .. N-1``; the run's ``sweep.md`` lists them).
      network: a network of the same architecture to load into, for a run
        whose checkpoints do not say how to rebuild it (default: rebuilt
        from the checkpoint's metadata).
      deterministic: mode actions (True) or sampled ones.
    """
    from nnx_ppo.network_spec import load_network

    return Policy(load_network(run_or_checkpoint, network, seed=seed, step=step, member=member), deterministic)


@dataclasses.dataclass(frozen=True)
class ExportedPolicy:
    """An exported policy read back by :func:`load_exported` (JAX only).

    ``initial_carry()`` gives the start carry (a list of arrays);
    ``step(carry, obs, done) -> (action, carry)`` as :class:`Policy`, with
    ``done`` a ``[n]`` bool array (all False where nothing ended).
    """

    step_fn: Any
    init_fn: Any
    params: list
    batch_size: int

    def initial_carry(self) -> list:
        return self.init_fn.call(self.params)

    def step(self, carry: list, obs: Any, done: Any) -> tuple[Any, list]:
        return self.step_fn.call(self.params, carry, obs, done)


def load_exported(path: str | os.PathLike) -> ExportedPolicy:
    """Read what :meth:`Policy.export` wrote: ``step.jax`` and
    ``initial_carry.jax`` (serialized :mod:`jax.export` functions),
    ``params.npz`` (the parameters they take first) and ``policy.json``. The
    same can be done with JAX and NumPy alone, where nnx_ppo is not
    installed::

        import numpy as np
        from jax import export

        step = export.deserialize(open(f"{path}/step.jax", "rb").read())
        init = export.deserialize(open(f"{path}/initial_carry.jax", "rb").read())
        data = np.load(f"{path}/params.npz")
        params = [data[f"arr_{i}"] for i in range(len(data.files))]
        carry = init.call(params)
        action, carry = step.call(params, carry, obs, done)
    """
    root = pathlib.Path(path)
    if not (root / _STEP_FILE).is_file():
        raise FileNotFoundError(f"load_exported: {os.fspath(root)!r} holds no exported policy ({_STEP_FILE} missing)")
    info = json.loads((root / _INFO_FILE).read_text())
    data = np.load(root / _PARAMS_FILE)
    return ExportedPolicy(step_fn=jax.export.deserialize((root / _STEP_FILE).read_bytes()),
                          init_fn=jax.export.deserialize((root / _INIT_FILE).read_bytes()),
                          params=[data[f"arr_{i}"] for i in range(len(data.files))],
                          batch_size=int(info["batch_size"]))
