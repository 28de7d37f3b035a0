"""A trained policy to load, step and export, and the exported files read back.

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
artifact that runs with JAX alone (no nnx_ppo, no Flax), for any batch size:
the files :data:`EXPORT_FILES`, checked and read back by
:func:`load_exported` (an :class:`ExportedPolicy`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import traceback
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.algorithms.functional import NetworkFn, copy_tree
from nnx_ppo.networks.types import select_where

__all__ = ["Policy", "load_policy", "load_exported", "ExportedPolicyError", "ExportDirInUseError", "ExportWarning"]


# --------------------------------------------------------------------------- the files of an export


STEP_FILE = "step.jax"


INIT_FILE = "initial_carry.jax"


INFO_FILE = "policy.json"


PARAMS_FILE = "params.npz"


EXPORT_FILES = (STEP_FILE, INIT_FILE, PARAMS_FILE, INFO_FILE)
"""The files :meth:`Policy.export` writes (and nothing else)."""


FORMAT = "nnx-ppo exported policy 2"  # 2: any batch size; initial_carry takes a [n] bool array


ANY = "any"  # policy.json's batch_size of a step exported for any batch size


class ExportedPolicyError(ValueError):
    """A file of an exported policy is truncated or not what
    :meth:`Policy.export` writes; the message (one line) names the file."""


class ExportDirInUseError(FileExistsError):
    """The directory an export would write to holds something else, or a
    previous export that ``overwrite`` was not given to replace."""


class ExportWarning(UserWarning):
    """The network could not be exported for any batch size and was exported
    for one batch size."""


def first_line(error: BaseException, limit: int = 160) -> str:
    """``error``'s type and the first line of its message, at most ``limit`` characters."""
    line = (str(error).strip().splitlines() or [""])[0]
    line = line if len(line) <= limit else line[:limit - 3] + "..."
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _listing(names: list[str], limit: int = 5) -> str:
    """``a, b, c`` (and N more)."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_export_directory(path: str | os.PathLike, overwrite: bool = False, flag: str = "overwrite=True") -> list[str]:
    """The files of a previous export that an export to ``path`` replaces
    (``[]`` for a new or empty directory).

    An :class:`ExportDirInUseError` (one line) refuses a ``path`` that is a
    file, one that holds anything but an export's files (:data:`EXPORT_FILES`;
    never deleted or mixed in with), and one that holds a previous export
    unless ``overwrite``. ``flag`` is how the message names the overwrite
    option (``"--overwrite"`` on the command line).
    """
    root = pathlib.Path(path)
    if not root.exists():
        return []
    if not root.is_dir():
        raise ExportDirInUseError(f"{os.fspath(root)} is a file; an exported policy is written to a directory "
                                  f"({', '.join(EXPORT_FILES)}): choose a new or empty one")
    names = sorted(p.name for p in root.iterdir())
    others = [name for name in names if name not in EXPORT_FILES]
    if others and overwrite:
        raise ExportDirInUseError(f"{os.fspath(root)} holds {_listing(others)}, not an exported policy's files: "
                                  f"{flag} replaces a previous export only; choose a new or empty directory")
    if others:
        raise ExportDirInUseError(f"{os.fspath(root)} is not empty (it holds {_listing(others)}); export to a new or "
                                  "empty directory")
    if names and not overwrite:
        raise ExportDirInUseError(f"{os.fspath(root)} already holds an exported policy ({', '.join(names)}); pass "
                                  f"{flag} to replace it, or export to a new or empty directory")
    return names


# --------------------------------------------------------------------------- the policy


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


def _shapes(tree: Any) -> str:
    """The shapes of ``tree``'s leaves for a message: ``(3, 5)``, or ``[(3, 5), (3, 2)]``."""
    shapes = [tuple(np.shape(x)) for x in jax.tree.leaves(tree)]
    return str(shapes[0]) if len(shapes) == 1 else str(shapes)


def _batch_size(tree: Any) -> int | None:
    """The one leading size ``n`` of ``tree``'s leaves (``[n, ...]``); None
    when they have several, or a leaf has none."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(tree)}
    return sizes.pop() if len(sizes) == 1 else None


def _check_batch(carry: Any, obs: Any, done: Any) -> None:
    """``obs`` (leaves ``[n, ...]``) and ``done`` (``[n]``) must be batches of
    the carry's ``n`` envs: a one-line ValueError naming the shapes otherwise."""
    n = _batch_size(obs)
    if n is None:
        raise ValueError(f"Policy: obs must be a batch whose leaves are [n, ...] with one n, got shapes {_shapes(obs)}")
    state = carry[0] if isinstance(carry, tuple) and len(carry) == 3 else None
    held = {np.shape(x)[0] for x in jax.tree.leaves(state) if np.ndim(x)}
    if len(held) == 1 and n not in held:
        raise ValueError(f"Policy: obs has a batch of {n} envs (shape {_shapes(obs)}), but the carry holds "
                         f"{held.pop()} (shape {_shapes(state)}); make the carry with initial_carry({n})")
    if done is not None and np.shape(done) != (n,):
        raise ValueError(f"Policy: done must have shape ({n},), one flag per env of obs (shape {_shapes(obs)}), got "
                         f"shape {tuple(np.shape(done))}")


def _initial(network: NetworkFn, n: int) -> tuple[Any, Any, Any]:
    """The policy carry of ``n`` fresh envs."""
    state, network = network.initialize(n)
    return state, state, network.rest


class Policy:
    """A trained network as a compiled step ``(carry, obs, done) -> (action, carry)``.

    Build one with :func:`load_policy` or ``Policy(network)`` (an NNX
    actor-critic; its variables are copied, the module is left as it is).
    Deterministic policies take the mode (mean) action; with
    ``deterministic=False`` actions are sampled. ``env``, the env the policy
    acts in, gives :meth:`export` the shapes of its observations (a policy
    from :func:`load_policy` knows its run's env).

    The carry holds what the next step needs: the network's carry (leaves
    ``[n, ...]``), the carry a reset would give, and the network's random
    streams (what a sampler, or a module drawing fresh keys on reset, draws
    from). A policy is a pure function of its carry: the same carry and
    observations give the same actions, and ``done=None`` is the same as
    ``done`` all False.
    """

    def __init__(self, network: Any, deterministic: bool = True, *, env: Any = None):
        self.deterministic = bool(deterministic)
        self._network = copy_tree(NetworkFn.of(network, self.deterministic))
        self._step = jax.jit(_act)
        self._init = jax.jit(_initial, static_argnums=1)
        # the env, or (set by load_policy) a function that rebuilds the run's env when needed
        self._make_env: Callable[[], Any] | None = None if env is None else (lambda: env)
        self._observation: Any = None

    def initial_carry(self, n: int) -> Any:
        """The carry of ``n`` envs at the start of their episodes."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"Policy.initial_carry: n must be a positive int (the number of envs), got {n!r}")
        return self._init(self._network, n)

    def __call__(self, carry: Any, obs: Any, done: Any = None) -> tuple[Any, Any]:
        """Act on ``obs`` (leaves ``[n, ...]``) from ``carry``; where ``done``
        (``[n]`` bool; None: nowhere) the carry is reset first. Returns
        ``(action, next carry)``."""
        _check_batch(carry, obs, done)
        done = None if done is None else jnp.asarray(done, bool)
        return self._step(self._network, carry, obs, done)

    def observation_spec(self) -> Any:
        """One env's observation as shapes (``jax.ShapeDtypeStruct`` leaves,
        no batch axis), from the policy's env; None when the policy does not
        know its env (built from a network alone)."""
        if self._observation is None and self._make_env is not None:
            try:
                env = self._make_env()
            except (ValueError, TypeError, ImportError) as e:
                raise ValueError(f"Policy: cannot rebuild the env of this policy's run ({e}); pass an example "
                                 "observation batch to export (policy.export(path, obs))") from None
            self._observation = jax.eval_shape(lambda key: env.reset(key).obs, jax.random.key(0))
        return self._observation

    def export(self, path: str | os.PathLike, obs: Any = None, platforms: tuple[str, ...] | None = None, *,
               batch_size: int | None = None, overwrite: bool = False) -> pathlib.Path:
        """Write the policy's step as a :mod:`jax.export` artifact in the
        directory ``path`` (created): :data:`EXPORT_FILES`.

        The artifact is the parameters and the step compiled together: it
        needs JAX only (:func:`load_exported`). Its batch dimension is
        symbolic, so one artifact serves any number of envs. The shapes of an
        observation come from the policy's env (see :meth:`observation_spec`)
        or from ``obs``, an example observation batch (arrays or
        ``jax.ShapeDtypeStruct``, ``[n, ...]``). ``batch_size`` (default:
        ``obs``'s ``n``, else 1) is the number of envs
        :meth:`ExportedPolicy.initial_carry` gives by default; a network that
        a module keeps from being exported for any batch size (one that needs
        the batch size as a number) is exported for that batch size alone,
        with an :class:`ExportWarning`. ``platforms`` (default: the current
        backend) are the ones it runs on, e.g. ``("cpu", "cuda")``. The
        exported carry is a flat list of arrays (random keys as their
        ``uint32`` data).

        ``path`` must be new or empty; with ``overwrite=True`` it may hold a
        previous export, whose files are replaced. Anything else in it is an
        :class:`ExportDirInUseError` (see :func:`check_export_directory`).
        """
        out = pathlib.Path(path)
        check_export_directory(out, overwrite)
        observation, n = self._export_observation(obs)
        if batch_size is not None:
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
                raise ValueError(f"Policy.export: batch_size must be a positive int, got {batch_size!r}")
            n = batch_size
        n = n or 1
        platforms = tuple(platforms or (jax.default_backend(),))
        try:
            init, step, params = self._exported(observation, jax.export.symbolic_shape("b")[0], platforms)
            batch: int | str = ANY
        except Exception as symbolic_error:  # a module needs a concrete batch size: export for n envs
            init, step, params = self._exported(observation, n, platforms)
            batch = n
            warnings.warn(f"Policy.export: the network cannot be exported for any batch size "
                          f"({_symbolic_failure(symbolic_error)}); exported for batches of {n} only", ExportWarning,
                          stacklevel=2)
        arrays = io.BytesIO()
        np.savez(arrays, *[np.asarray(x) for x in params])
        info = {
            "format": FORMAT,
            "batch_size": batch,
            "default_batch_size": n,
            "deterministic": self.deterministic,
            "platforms": list(platforms),
            "carry_leaves": len(init.out_avals),
            "params": len(params),
            "usage": "params = [np.load('params.npz')[f'arr_{i}'] for i in range(params)]; "
                     "carry = initial_carry.call(params, np.zeros(n, bool)); "
                     "action, carry = step.call(params, carry, obs, done)",
        }
        contents = {STEP_FILE: step.serialize(), INIT_FILE: init.serialize(), PARAMS_FILE: arrays.getvalue(),
                    INFO_FILE: (json.dumps(info, indent=2) + "\n").encode()}
        out.mkdir(parents=True, exist_ok=True)
        for name, data in contents.items():  # every file is ready before the first is written
            (out / name).write_bytes(data)
        return out

    def _export_observation(self, obs: Any) -> tuple[Any, int | None]:
        """One env's observation as shapes, and the batch size of ``obs``
        (None when it comes from the policy's env)."""
        if obs is not None:
            spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), obs)
            n = _batch_size(spec)
            if n is None:
                raise ValueError(f"Policy.export: obs must be a batch with one leading size [n, ...], got shapes "
                                 f"{[x.shape for x in jax.tree.leaves(spec)]}")
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), spec), n
        observation = self.observation_spec()
        if observation is None:
            raise ValueError("Policy.export: this policy does not know its env's observations (it was built from a "
                             "network alone); pass an example batch, policy.export(path, obs), or build it as "
                             "Policy(network, env=env)")
        return observation, None

    def _exported(self, observation: Any, batch: Any, platforms: tuple[str, ...]) -> tuple[Any, Any, list]:
        """The exported initial carry and step for batches of ``batch`` (a
        number or a symbolic dimension), and the parameters they take first."""
        params, params_def = jax.tree.flatten(self._network.params)

        def network(params):  # the parameters come in as arguments, as in the live step
            return self._network.with_state(params=jax.tree.unflatten(params_def, params))

        leaves, carry_def = jax.tree.flatten(self.initial_carry(1))
        key_impls = [jax.random.key_impl(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else None for x in leaves]

        def to_data(tree):  # typed PRNG keys cross the boundary as their uint32 data
            return [jax.random.key_data(x) if impl is not None else x
                    for x, impl in zip(jax.tree.leaves(tree), key_impls)]

        def from_data(data):
            return jax.tree.unflatten(carry_def, [jax.random.wrap_key_data(x, impl=impl) if impl is not None else x
                                                  for x, impl in zip(data, key_impls)])

        def initial_carry(params, done):  # only the length of done is read: the number of envs
            return to_data(_initial(network(params), done.shape[0]))

        def step(params, carry_data, obs, done):
            action, carry = _act(network(params), from_data(carry_data), obs, done)
            return action, to_data(carry)

        params_spec = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in params]
        done_spec = jax.ShapeDtypeStruct((batch,), jnp.bool_)
        obs_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct((batch, *x.shape), x.dtype), observation)
        init = jax.export.export(jax.jit(initial_carry), platforms=platforms)(params_spec, done_spec)
        carry_spec = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in init.out_avals]
        exported_step = jax.export.export(jax.jit(step), platforms=platforms)(params_spec, carry_spec, obs_spec,
                                                                              done_spec)
        return init, exported_step, params


def _symbolic_failure(error: BaseException) -> str:
    """Where and why tracing with a symbolic batch size failed: the last
    frame outside JAX and Flax (the module that needs a number), and the
    error's first line."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not any(part in f.filename.replace(os.sep, "/") for part in ("/jax/", "/jaxlib/", "/flax/"))]
    where = f"in {frames[-1].name}, {frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    return where + first_line(error)


def _env_maker(run_or_checkpoint: str | os.PathLike, step: int | str | None, seed: int | None,
               member: int | None) -> Callable[[], Any] | None:
    """A function that makes the env of the checkpoint :func:`load_policy`
    loads, from its metadata's network spec; None when the metadata names
    no env that :func:`nnx_ppo.envs.make` can rebuild."""
    import nnx_ppo.algorithms.checkpointing as checkpointing
    from nnx_ppo.network_spec import NetworkSpec

    which = seed if member is None else member
    try:
        path = checkpointing.find_checkpoint(run_or_checkpoint, step, which if step == "best" else None)
        metadata = checkpointing.load_metadata(path)
        spec = NetworkSpec.from_dict(metadata.get("network") if isinstance(metadata, dict) else None)
    except (OSError, ValueError):
        return None
    return spec.make_env if spec.env and not spec.env.startswith("python:") else None


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

    The policy knows the run's env (rebuilt from the checkpoint's metadata
    when it is first needed), so :meth:`Policy.export` needs no example
    observation.
    """
    from nnx_ppo.network_spec import load_network

    policy = Policy(load_network(run_or_checkpoint, network, seed=seed, step=step, member=member), deterministic)
    policy._make_env = _env_maker(run_or_checkpoint, step, seed, member)
    return policy


# --------------------------------------------------------------------------- an export read back


@dataclasses.dataclass(frozen=True)
class ExportedPolicy:
    """An exported policy read back by :func:`load_exported` (JAX only).

    ``initial_carry(n)`` gives the start carry of ``n`` envs (a list of
    arrays; ``n`` defaults to ``batch_size``); ``step(carry, obs, done) ->
    (action, carry)`` as :class:`Policy`, with ``done`` a ``[n]`` bool array
    (all False where nothing ended). With ``any_batch_size`` the step takes
    any number of envs; otherwise ``batch_size`` envs only.
    """

    step_fn: Any
    init_fn: Any
    params: list
    batch_size: int
    any_batch_size: bool = False

    def initial_carry(self, n: int | None = None) -> list:
        """The carry of ``n`` envs (default ``batch_size``) at the start of their episodes."""
        n = self.batch_size if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"ExportedPolicy.initial_carry: n must be a positive int (the number of envs), got {n!r}")
        if not self.any_batch_size and n != self.batch_size:
            raise ValueError(f"ExportedPolicy.initial_carry: this policy was exported for batches of {self.batch_size} "
                             f"envs only, got n={n}")
        return self.init_fn.call(self.params, np.zeros((n,), bool))

    def step(self, carry: list, obs: Any, done: Any = None) -> tuple[Any, list]:
        """Act on ``obs`` (leaves ``[n, ...]``); where ``done`` (``[n]`` bool;
        None: nowhere) the carry is reset first. Returns ``(action, next carry)``."""
        if done is None:
            done = np.zeros((np.shape(jax.tree.leaves(obs)[0])[0],), bool)
        return self.step_fn.call(self.params, carry, obs, done)


def _read_export_file(root: pathlib.Path, name: str, what: str, read: Callable[[pathlib.Path], Any]) -> Any:
    """``read(root / name)``; a missing file is a FileNotFoundError, one that
    does not read back an :class:`ExportedPolicyError` saying it is truncated
    or not ``what``, both one line naming the file."""
    path = root / name
    if not path.is_file():
        raise FileNotFoundError(f"load_exported: {os.fspath(path)} is missing; an exported policy is "
                                f"{', '.join(EXPORT_FILES)} (written by Policy.export or nnx-ppo export)")
    try:
        return read(path)
    except Exception as e:  # any way a damaged file fails to parse: name it, in one line
        raise ExportedPolicyError(f"load_exported: {os.fspath(path)} is truncated or not {what} "
                                  f"({first_line(e, 100)})") from None


def _read_info(path: pathlib.Path) -> dict:
    info = json.loads(path.read_text())
    if not isinstance(info, dict) or not str(info.get("format", "")).startswith("nnx-ppo exported policy"):
        raise ValueError(f"no 'format': 'nnx-ppo exported policy N' entry, got {str(info)[:60]}")
    batch = info.get("batch_size")
    if not (batch == ANY or isinstance(batch, int)):
        raise ValueError(f"batch_size must be 'any' or an int, got {batch!r}")
    return info


def _read_params(path: pathlib.Path) -> list:
    with np.load(path, allow_pickle=False) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def export_info(path: str | os.PathLike) -> dict:
    """The ``policy.json`` of the exported policy in ``path`` (a dict; see
    :meth:`Policy.export`); errors as :func:`load_exported`'s."""
    return _read_export_file(pathlib.Path(path), INFO_FILE, "an exported policy's policy.json", _read_info)


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
        carry = init.call(params, np.zeros(n, bool))   # n envs
        action, carry = step.call(params, carry, obs, done)

    A missing file is a FileNotFoundError, a truncated or damaged one an
    :class:`ExportedPolicyError`; each message is one line naming the file.
    """
    root = pathlib.Path(path)
    if not (root / STEP_FILE).is_file():
        raise FileNotFoundError(f"load_exported: {os.fspath(root)!r} holds no exported policy ({STEP_FILE} missing)")
    info = export_info(root)
    if info["format"] != FORMAT:
        version = str(info["format"]).rsplit(" ", 1)[-1]
        earlier = version.isdigit() and int(version) < int(FORMAT.rsplit(" ", 1)[-1])
        raise ExportedPolicyError(
            f"load_exported: {os.fspath(root / INFO_FILE)} says {info['format']!r}: "
            + ("it was written by an earlier, unreleased version of nnx-ppo and cannot be read; " if earlier else "")
            + f"this version reads {FORMAT!r} (export the policy again with this version)")

    def deserialize(file: pathlib.Path) -> Any:
        return jax.export.deserialize(bytearray(file.read_bytes()))

    step_fn = _read_export_file(root, STEP_FILE, "a jax.export artifact", deserialize)
    init_fn = _read_export_file(root, INIT_FILE, "a jax.export artifact", deserialize)
    params = _read_export_file(root, PARAMS_FILE, "a NumPy .npz archive", _read_params)
    if len(params) != info.get("params", len(params)):
        raise ExportedPolicyError(f"load_exported: {os.fspath(root / PARAMS_FILE)} holds {len(params)} arrays, but "
                                  f"{INFO_FILE} says {info['params']}: the files are of different exports")
    any_batch = info["batch_size"] == ANY
    return ExportedPolicy(step_fn=step_fn, init_fn=init_fn, params=params,
                          batch_size=int(info.get("default_batch_size", 1) if any_batch else info["batch_size"]),
                          any_batch_size=any_batch)
