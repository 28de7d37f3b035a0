"""A functional view of an NNX network: what the compiled training program holds.

:class:`NetworkFn` is a pytree of the network's state (``params``: the
``nnx.Param`` variables; ``rest``: every other variable, e.g. normalizer
statistics and RNG streams) with the static ``graphdef`` as metadata. Its
methods run the module contract functionally and return the updated view
instead of mutating a module, so they can be traced, scanned, vmapped and
differentiated (with respect to ``params``) like any JAX function::

    net = NetworkFn.of(network, deterministic=False)   # nnx.split once
    carry, net = net.initialize(B)
    out, net = net.apply(carry, obs)                    # one step, [B, ...]
    replay = net.replay(trajectory)                     # [T, M] loss replay
    net = net.update_statistics(extras)                 # [T, B, ...] extras

Before anything compiles, :func:`check_network_matches_env` checks from
shapes alone that a network fits an env (its observations, actions and
rewards).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.envs.spaces import Discrete
from nnx_ppo.envs.types import check_actions, check_env_structure
from nnx_ppo.networks.feedforward import current_precision
from nnx_ppo.networks.sampling_layers import categorical_choices
from nnx_ppo.networks.types import SequenceOutput, StatefulModule, StatefulModuleOutput, replay_in_time, unrolled

__all__ = ["NetworkFn", "copy_leaf", "ReplayMismatchError"]


class ReplayMismatchError(RuntimeError):
    """Raised when the loss replay does not reproduce the rollout before the
    first update: a module breaks the rules of docs/custom_modules.md."""


def rule_breaking_module_error(err: BaseException, network: Any = None) -> ReplayMismatchError:
    """A :class:`ReplayMismatchError` for Flax's ``TraceContextError`` (a module
    mutated an NNX variable, e.g. drew from a class-level ``nnx.Rngs``,
    inside ``__call__`` under a JAX transform), naming the innermost
    :class:`~nnx_ppo.networks.types.StatefulModule` whose ``__call__`` was
    running and, given the ``network``, its path in it
    (``layers/1 (MyNoisyNeuron)``)."""
    culprit = None
    tb = err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if tb.tb_frame.f_code.co_name == "__call__" and isinstance(owner, StatefulModule):
            culprit = type(owner)
        tb = tb.tb_next
    where = "a module"
    if culprit is not None:
        paths = []
        if network is not None:
            paths = ["/".join(str(p) for p in path) or "(the network itself)"
                     for path, module in nnx.iter_modules(network) if type(module) is culprit]
        where = (f"module {', '.join(paths)} ({culprit.__name__})" if paths else f"module {culprit.__name__}")
    return ReplayMismatchError(
        f"{where} mutates an NNX variable inside __call__ (Flax: {str(err).splitlines()[0]}). The randomness rule "
        "of docs/custom_modules.md: keep one key per env in the carry (seeded in initialize_state, split in "
        "__call__) instead of drawing from a class-level nnx.Rngs; running statistics change only in "
        "update_statistics.")


@dataclasses.dataclass(frozen=True)
class NetworkFn:
    """The network as ``(graphdef, params, rest)``; see the module docstring.

    Attributes:
      graphdef: the static structure (``nnx.split``'s graph definition).
      params: the ``nnx.Param`` state (what the optimizer updates).
      rest: every other variable.
    """

    graphdef: Any
    params: Any
    rest: Any

    @classmethod
    def of(cls, network: nnx.Module, deterministic: bool | None = None) -> "NetworkFn":
        """Split ``network``; with ``deterministic`` set, every module's
        ``deterministic`` flag is set as asked in the view (training: False,
        evaluation: True), and the network's own flags are left as they were."""
        if deterministic is None:
            return cls(*nnx.split(network, nnx.Param, ...))
        modules = [m for _, m in nnx.iter_modules(network) if hasattr(m, "deterministic")]
        saved = [m.deterministic for m in modules]
        for m in modules:
            m.deterministic = deterministic
        try:
            return cls(*nnx.split(network, nnx.Param, ...))
        finally:
            for m, flag in zip(modules, saved):
                m.deterministic = flag

    def module(self) -> nnx.Module:
        """A fresh module with this state (``nnx.merge``). Its variables are
        new objects holding the same arrays, made in the current trace: a
        write to one of them (a module writing a variable in ``__call__``)
        changes neither this view nor any other module."""
        params, rest = jax.tree.map(lambda leaf: leaf, (self.params, self.rest))
        return nnx.merge(self.graphdef, params, rest)

    def with_state(self, params: Any = None, rest: Any = None) -> "NetworkFn":
        """The same network with other ``params`` and/or ``rest``."""
        return NetworkFn(self.graphdef, self.params if params is None else params,
                         self.rest if rest is None else rest)

    def _run(self, method: str, *args) -> tuple[Any, "NetworkFn"]:
        """Call ``module.method(*args)``; return its result and the view with
        the module's updated non-parameter variables."""
        module = self.module()
        result = getattr(module, method)(*args)
        _, _, rest = nnx.split(module, nnx.Param, ...)
        return result, self.with_state(rest=rest)

    def apply(self, carry: Any, obs: Any, extras: Any = None) -> tuple[StatefulModuleOutput, "NetworkFn"]:
        """One forward step on a ``[B, ...]`` batch (sampler RNG streams advance)."""
        return self._run("__call__", carry, obs, extras)

    def initialize(self, batch_size: int) -> tuple[Any, "NetworkFn"]:
        """``initialize_state(batch_size)``: the carry of ``batch_size`` fresh envs."""
        return self._run("initialize_state", batch_size)

    def reset(self, carry: Any) -> tuple[Any, "NetworkFn"]:
        """``reset_state(carry)`` for the whole batch (the caller selects per env)."""
        return self._run("reset_state", carry)

    def fixed_resets(self, carry: Any) -> list[bool]:
        """Per leaf of ``carry`` (flattened): whether :meth:`reset` gives it a
        value that depends on the parameters only (a zero or learned initial
        state), so that every reset gives the same value while the parameters
        stay; not where it depends on the carry or on a variable a step
        advances (random keys). Traced, not run: a reset that draws from
        outside JAX (a host callback) breaks the randomness rule and may be
        taken as fixed."""
        leaves = jax.tree.leaves(carry)
        rest, rest_def = jax.tree.flatten(self.rest)
        carry_def = jax.tree.structure(carry)

        def depends(i):
            def fresh_leaf(*args):
                view = self.with_state(rest=jax.tree.unflatten(rest_def, args[:len(rest)]))
                return jax.tree.leaves(view.reset(jax.tree.unflatten(carry_def, args[len(rest):]))[0])[i]
            return any(_inputs_used(fresh_leaf, rest + leaves))

        return [not depends(i) for i in range(len(leaves))]

    def replay(self, trajectory: Any, unroll: int = 1) -> SequenceOutput:
        """Re-run a ``[T, M]`` slice of a rollout from its stored start carry,
        feeding back the stored extras and resets (``replay_sequence``).
        ``trajectory`` is a :class:`~nnx_ppo.algorithms.ppo.Trajectory`;
        ``unroll`` is what the replay's scans over time unroll
        (:func:`~nnx_ppo.networks.types.scan_unroll`).

        The replay starts from this view's variables (as the rollout left
        them) and writes made to variables during it are discarded. A write
        is allowed when the replayed output does not depend on the value the
        variable had before it (a call counter, a cache written before it is
        read); otherwise the rollout's write would change what the replay
        computes, and this raises :class:`ReplayMismatchError`
        naming the module (checked when the replay is traced)."""
        module = self.module()
        before = _variable_leaves(module)
        with unrolled(unroll):
            result = self._replay_module(module, trajectory)
        after = _variable_leaves(module)
        written = _written(before, after)
        if written:
            _refuse_output_changing_writes(self, trajectory, module, before, written)
        return result

    @staticmethod
    def _replay_module(module: nnx.Module, trajectory: Any) -> SequenceOutput:
        """The module's ``replay_sequence``; under bfloat16 (:func:`current_precision`)
        the network's own step, one step at a time at the minibatch's size instead.
        The fast replays compute the same products at other shapes ([T * M]
        rows, other fusions), which on a TPU can differ from the rollout's in
        float32's last bit; rounded to bfloat16 such a bit can become 2^-8 of
        an input, and a few updates later pass ``replay_tolerance``."""
        start = jax.tree.map(lambda x: x[0], trajectory.start_carry)
        replay = replay_in_time if current_precision() == "bfloat16" else type(module).replay_sequence
        return replay(module, start, trajectory.obs, trajectory.extras, trajectory.reset, trajectory.stored_carry())

    def update_statistics(self, extras: Any) -> "NetworkFn":
        """Fold a rollout's ``[T, B, ...]`` extras into running statistics."""
        return self._run("update_statistics", extras)[1]


jax.tree_util.register_dataclass(NetworkFn, data_fields=["params", "rest"], meta_fields=["graphdef"])


def _variable_leaves(module: nnx.Module) -> tuple[list[tuple[tuple, Any]], Any]:
    """``([(path, value)], treedef)`` of every variable of ``module``
    (parameters first), paths as tuples of plain keys."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(nnx.split(module, nnx.Param, ...)[1:])
    return [(_plain_path(path), leaf) for path, leaf in flat], treedef


def _plain_path(path: tuple) -> tuple:
    keys = []
    for entry in path[1:]:  # path[0] picks params or rest
        if isinstance(entry, jax.tree_util.DictKey):
            keys.append(entry.key)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            keys.append(entry.idx)
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            if entry.name != "value":
                keys.append(entry.name)
        else:
            keys.append(str(entry))
    return tuple(keys)


def _written(before: tuple, after: tuple) -> list[int]:
    """Indices of the variable leaves a call replaced (a write stores a new
    value object; an untouched variable keeps its own)."""
    (old, old_def), (new, new_def) = before, after
    if old_def != new_def:
        raise ReplayMismatchError(
            "a module added or removed an NNX variable during the loss replay (inside __call__ or "
            "replay_sequence); variables are created in __init__ (docs/custom_modules.md)")
    return [i for i, ((_, a), (_, b)) in enumerate(zip(old, new)) if a is not b]


def _refuse_output_changing_writes(view: NetworkFn, trajectory: Any, module: nnx.Module, before: tuple,
                                   written: list[int]) -> None:
    """Raise ReplayMismatchError if the replay's output, regularization or
    carry depends on the value a written variable had before the replay
    (found by dead-code elimination of the replay traced as a function of
    those values)."""
    leaves, treedef = before
    values = [leaves[i][1] for i in written]

    def replay_from(*written_values):
        new = [leaf for _, leaf in leaves]
        for i, value in zip(written, written_values):
            new[i] = value
        params, rest = jax.tree_util.tree_unflatten(treedef, new)
        fresh = nnx.merge(view.graphdef, params, rest)
        out = NetworkFn._replay_module(fresh, trajectory)
        return out.output, out.regularization_loss, out.carry

    depends = _inputs_used(replay_from, [jnp.asarray(v) for v in values])
    culprits = [leaves[i][0] for i, used in zip(written, depends) if used]
    if culprits:
        raise _output_changing_write_error(view, trajectory, module, culprits)


def _inputs_used(fn, args: list[Any]) -> list[bool]:
    """Which of ``args`` the outputs of ``fn(*args)`` depend on (traced, not
    run). JAX's dead-code elimination sees through scans and conds; where it
    is not available, a backward pass over the top-level equations, which
    counts every input of a used equation as used, decides (it may refuse a
    harmless write inside a nested scan, never allow a harmful one)."""
    closed = jax.make_jaxpr(fn)(*args)
    jaxpr = closed.jaxpr
    try:
        from jax._src.interpreters import partial_eval as pe

        _, used = pe.dce_jaxpr(pe.convert_constvars_jaxpr(jaxpr), [True] * len(jaxpr.outvars))
        return list(used[len(jaxpr.constvars):])
    except (ImportError, AttributeError, TypeError):
        pass
    live = {id(v) for v in jaxpr.outvars}
    for eqn in reversed(jaxpr.eqns):
        if any(id(v) in live for v in eqn.outvars):
            live.update(id(v) for v in eqn.invars)
    return [id(v) in live for v in jaxpr.invars]


def _output_changing_write_error(view: NetworkFn, trajectory: Any, module: nnx.Module,
                                 variable_paths: list[tuple]) -> Exception:
    """The :class:`ReplayMismatchError` naming, for
    each variable at ``variable_paths`` (paths in ``module``), the module that
    writes it: the innermost :class:`~nnx_ppo.networks.types.StatefulModule`
    whose ``__call__`` does (:func:`_writers`), else the innermost one holding it."""
    owners = {tuple(path): m for path, m in nnx.iter_modules(module) if isinstance(m, StatefulModule)}
    writers = _writers(view, trajectory, variable_paths)
    named = []
    for var_path in variable_paths:
        if var_path in writers:
            prefix, variable = writers[var_path]
        else:
            prefix = max((p for p in owners if var_path[:len(p)] == p), key=len, default=None)
            variable = var_path if prefix is None else var_path[len(prefix):]
        where = "a module" if prefix is None else f"module {module_name(prefix, owners[prefix])}"
        entry = f"{where} mutates an NNX variable ({'/'.join(str(k) for k in variable)})"
        if entry not in named:
            named.append(entry)
    return ReplayMismatchError(
        f"{'; '.join(named)} inside __call__, and its output depends on the value the rollout left there, so "
        "the loss replay cannot reproduce the rollout. A write that does not change the output (a call "
        "counter) is allowed. The randomness rule of docs/custom_modules.md: keep one key per env in the carry "
        "(seeded in initialize_state, split in __call__) instead of drawing from a class-level nnx.Rngs; "
        "running statistics change only in update_statistics.")


def module_name(path: tuple, module: nnx.Module) -> str:
    """``layers/1 (MyNoisyCell)``: a module's path in the network and its class."""
    return f"{'/'.join(str(k) for k in path) or '(the network itself)'} ({type(module).__name__})"


def _writers(view: NetworkFn, trajectory: Any, variable_paths: list[tuple]) -> dict[tuple, tuple[tuple, tuple]]:
    """``{variable path: (module path, variable path inside that module)}``:
    which module's ``__call__`` writes each variable, found by tracing the
    replay's first step (``jax.eval_shape``, nothing runs) with the
    ``__call__`` of every :class:`~nnx_ppo.networks.types.StatefulModule`
    observed. The innermost call around a write names it, so a variable
    several modules hold (an ``nnx.Rngs`` passed to every layer) is put on
    the one that writes it. Only used to word an error; a variable no
    ``__call__`` writes in one step (or a step that does not trace) is left out."""
    found: dict[tuple, tuple[tuple, tuple]] = {}

    def one_step(params, rest, step):
        module = nnx.merge(view.graphdef, params, rest)
        variables = dict(nnx.to_flat_state(nnx.state(module)))
        targets = {path: variables[path] for path in variable_paths if path in variables}

        def observe(path, owner, call):
            before = {p: v.get_value() for p, v in targets.items()}
            result = call()
            for p, v in targets.items():  # inner calls return first: the first to see a write made it
                if p not in found and v.get_value() is not before[p]:
                    inside = next((q for q, w in nnx.to_flat_state(nnx.state(owner)) if w is v), p)
                    found[p] = (path, tuple(inside))
            return result

        with observing_calls(module, "__call__", observe):
            module(*step)

    first = jax.tree.map(lambda x: x[0], (trajectory.start_carry, trajectory.obs, trajectory.extras))
    try:
        jax.eval_shape(one_step, view.params, view.rest, first)
    except Exception:  # noqa: BLE001 -- the message then names the module holding the variable
        return {}
    return found


@contextlib.contextmanager
def observing_calls(module: nnx.Module, method: str, observe: Callable[[tuple, Any, Callable[[], Any]], Any]):
    """While active, a call to ``method`` (e.g. ``"__call__"``) of any
    :class:`~nnx_ppo.networks.types.StatefulModule` of ``module`` goes
    through ``observe(path, m, call)``: ``path`` is the module's path in
    ``module``, ``m`` the module, and ``call()`` runs the method and returns
    its result, which ``observe`` returns (after looking at it). Nested calls
    are observed too, inner ones returning first. The method is replaced on
    the classes for the duration, so use it only to trace a step that
    explains an error, never in a training program."""
    paths = {id(m): tuple(path) for path, m in nnx.iter_modules(module) if isinstance(m, StatefulModule)}
    defining = {next((c for c in type(m).__mro__ if method in vars(c)), None)
                for _, m in nnx.iter_modules(module) if isinstance(m, StatefulModule)}
    originals = {c: vars(c)[method] for c in defining if c is not None}

    def observed(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if id(self) not in paths:
                return original(self, *args, **kwargs)
            return observe(paths[id(self)], self, lambda: original(self, *args, **kwargs))

        return wrapper

    for cls, original in originals.items():
        setattr(cls, method, observed(original))
    try:
        yield
    finally:
        for cls, original in originals.items():
            setattr(cls, method, original)


def copy_leaf(x: Any) -> jax.Array:
    """A copy of one array (PRNG key arrays included); a Python scalar
    (a variable holding a plain ``int``) becomes an array."""
    if not hasattr(x, "dtype"):
        return jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return _copy_key(x)
    return jnp.copy(x)


def _copy_key(x: jax.Array) -> jax.Array:
    return jax.random.wrap_key_data(jnp.copy(jax.random.key_data(x)), impl=jax.random.key_impl(x))


@jax.jit
def _copy_arrays(arrays: list) -> list:
    return [_copy_key(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else jnp.copy(x) for x in arrays]


def copy_tree(tree: Any) -> Any:
    """:func:`copy_leaf` of every leaf of ``tree``, its JAX arrays in one
    compiled call (one compile per tree structure, where a leaf at a time
    compiles a copy per shape: seconds on an accelerator)."""
    leaves, treedef = jax.tree.flatten(tree)
    is_array = [isinstance(x, jax.Array) for x in leaves]
    copied = iter(_copy_arrays([x for x, a in zip(leaves, is_array) if a]) if any(is_array) else [])
    return jax.tree.unflatten(treedef, [next(copied) if a else copy_leaf(x) for x, a in zip(leaves, is_array)])


def _unalias(tree: Any) -> Any:
    """Copy leaves that appear more than once (a module may build two carry
    leaves from one array), so the whole tree can be donated."""
    seen: set[int] = set()

    def leaf(x):
        if id(x) in seen:
            return copy_leaf(x)
        seen.add(id(x))
        return x

    return jax.tree.map(leaf, tree)


def _strong_types(tree: Any) -> Any:
    """Give weakly typed leaves (e.g. env fields built from Python floats)
    their plain dtype. The compiled iteration returns strongly typed arrays,
    so without this the second call would see a new signature and compile
    the whole program again."""

    def leaf(x):
        if getattr(x, "weak_type", False):
            return jax.lax.convert_element_type(x, x.dtype)
        return x

    return jax.tree.map(leaf, tree)


def donatable(tree: Any) -> Any:
    """``tree`` made safe to donate to a compiled call and to return from it
    with the same signature: no weak types, no leaf appearing twice."""
    return _unalias(_strong_types(tree))


# ----------------------------------------------------------------------------- does the network fit the env


def _check_carry(what: str, initial, other) -> None:
    """The carry keeps its tree, shapes and dtypes from step to step (the
    rollout scans it); a ValueError names the first leaf that changes."""
    if jax.tree.structure(initial) != jax.tree.structure(other):
        raise ValueError(
            f"the network's carry changes structure: initialize_state gives {jax.tree.structure(initial)}, "
            f"{what} is {jax.tree.structure(other)}; a module must return a carry like the one it was given "
            "(see docs/custom_modules.md)"
        )
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(initial), jax.tree.leaves(other)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(
                f"the network's carry leaf {jax.tree_util.keystr(path)} is {a.shape} {a.dtype} from "
                f"initialize_state but {b.shape} {b.dtype} in {what}; a module must keep its carry's shapes and "
                "dtypes from step to step (see docs/custom_modules.md)"
            )


def check_network_matches_env(env, network, config: PPOConfig) -> None:
    """Fail early, with names, when the network's value output does not match
    the reward structure or its outputs have the wrong batch shape."""
    B = config.n_envs
    env_state = jax.eval_shape(lambda k: jax.vmap(env.reset)(jax.random.split(k, B)), jax.random.key(0))

    def forward(net: NetworkFn, obs):
        carry, net = net.initialize(B)
        step, net = net.apply(carry, obs)
        reset, _ = net.reset(step.next_state)
        return carry, step.next_state, reset, step.output

    with categorical_choices() as choices:
        carry, next_carry, reset_carry, out = jax.eval_shape(forward, NetworkFn.of(network), env_state.obs)
    _check_carry("__call__'s next_state", carry, next_carry)
    _check_carry("reset_state's carry", carry, reset_carry)
    check_actions(env, out.actions, B)  # before the env steps with them
    space = getattr(env, "action_space", None)
    wrong = sorted({n for n in choices if isinstance(space, Discrete) and n != space.n})
    if wrong:
        raise ValueError(f"the network's CategoricalSampler chooses among {wrong[0]} actions, but the env's action "
                         f"space is {space}; give the policy head {space.n} outputs")
    check_env_structure(env, B, actions=out.actions)
    reward_tree = jax.tree.structure(env_state.reward)
    value_tree = jax.tree.structure(out.value_estimates)
    if reward_tree != value_tree:
        raise ValueError(
            f"the network's value_estimates have structure {value_tree} but the env's rewards have "
            f"structure {reward_tree}; give the value port one head per reward key"
        )
    for name, tree in (("value_estimates", out.value_estimates), ("loglikelihoods", out.loglikelihoods)):
        for leaf in jax.tree.leaves(tree):
            if leaf.shape != (B,):
                raise ValueError(f"the network's {name} have shape {leaf.shape}, expected ({B},) = (n_envs,)")
