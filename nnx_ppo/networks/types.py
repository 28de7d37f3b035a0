"""The module contract every nnx-ppo network piece follows.

A :class:`StatefulModule` is an ``nnx.Module`` whose forward pass takes and
returns a *carry* (``state``) explicitly::

    out = module(state, x, rollout_extras=None)
    out.next_state, out.output, out.regularization_loss, out.metrics, out.rollout_extras

Shapes: ``x`` and every leaf of ``state`` have the batch ``[B, ...]`` as the
leading axis; there is no time axis inside ``__call__`` (the trainer scans
time). ``update_statistics`` receives the ``rollout_extras`` the module
emitted during a rollout, stacked to ``[T, B, ...]``.

Rules (see ``docs/custom_modules.md``):

* ``__call__`` never writes an NNX variable that changes the forward output
  (a write that does not, such as a call counter, is allowed: kept in the
  rollout, discarded in the loss replay); running statistics change only in
  :meth:`StatefulModule.update_statistics`.
* A stochastic module keeps one PRNG key per env in its carry (shape ``[B]``),
  seeded in :meth:`StatefulModule.initialize_state` and split locally in
  ``__call__``. Action samplers are the one exception.

The replay machinery (the second half of this module) re-runs a whole
stored stretch ``[T, M]`` of a rollout for the loss:
:func:`replay_in_time` (the reference: a scan over time with the rollout's
resets), :func:`replay_flat` (modules without carry run once on the
flattened ``[T * M]`` batch), :func:`replay_key_chain` (a per-env key
chain scanned alone, the call run for all steps at once),
:func:`straight_through` (stored value,
recomputed gradient), the one guard :func:`has_fast_replay` that decides
whether a module's faster ``replay_sequence`` applies, and the small helpers
they share.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "ACTIVATION_KEY", "StatefulModule", "StatefulModuleOutput", "PPONetworkOutput", "ModuleState", "batch_size_of",
    "as_rngs", "split_key_carry", "select_where", "replay_in_time", "replay_key_chain", "scan_unroll",
    "has_fast_replay", "JaxDataclass",
]


# ----------------------------------------------------------------------------- JaxDataclass


class JaxDataclass:
    """A mixin that makes a frozen dataclass usable as a JAX pytree.

    Every field of the dataclass is a child of the pytree (none is static), in
    field order. Rebuilding the object from its children (what JAX does inside
    ``jit``, ``vmap`` or ``scan``, possibly with tracers or placeholder values
    as children) does not call ``__init__``, so a validating ``__init__`` or
    ``__post_init__``, or a runtime type checker instrumenting it, only sees the
    values a user passes::

        import dataclasses

        import jax
        import jax.numpy as jnp

        from nnx_ppo.networks.types import JaxDataclass

        @jax.tree_util.register_pytree_node_class
        @dataclasses.dataclass(frozen=True)
        class Step(JaxDataclass):
            obs: jax.Array
            reward: jax.Array

        step = Step(obs=jnp.zeros((4, 3)), reward=jnp.zeros(4))
        jax.tree.map(lambda x: x + 1, step).replace(reward=jnp.ones(4))

    Register the class with ``jax.tree_util.register_pytree_node_class`` (as
    above, below the dataclass decorator) or with
    ``jax.tree_util.register_pytree_with_keys_class``; the latter also gives the
    leaves attribute key paths (``.obs``).
    """

    def replace(self, **changes: Any) -> Any:
        """A copy with the given fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def tree_flatten(self) -> tuple[list[Any], tuple[str, ...]]:
        """``(children, names)``: every field's value, in field order."""
        names = tuple(field.name for field in dataclasses.fields(self))  # type: ignore[arg-type]
        return [getattr(self, name) for name in names], names

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], tuple[str, ...]]:
        """Like :meth:`tree_flatten`, with a ``GetAttrKey`` per child."""
        children, names = self.tree_flatten()
        return [(jax.tree_util.GetAttrKey(name), child) for name, child in zip(names, children)], names

    @classmethod
    def tree_unflatten(cls, names: tuple[str, ...], children: Any) -> Any:
        """Rebuild an instance without running ``__init__`` (frozen fields set directly)."""
        obj = object.__new__(cls)
        for name, value in zip(names, children):
            object.__setattr__(obj, name, value)
        return obj


#: The metrics key under which a module of a recording copy of a network
#: (:func:`nnx_ppo.networks.recording.with_recording`) reports its activation.
ACTIVATION_KEY = "__activation__"


def activation_metrics(output: Any) -> dict[str, Any]:
    """A recorded ``output`` as metrics: ``{ACTIVATION_KEY: array}`` for an
    array, one flat entry per leaf for a pytree (``"__activation__/motor"``),
    so that every metric stays an array (a rollout and the loss replay
    average them)."""
    leaves = jax.tree_util.tree_leaves_with_path(output)
    if len(leaves) == 1 and not leaves[0][0]:
        return {ACTIVATION_KEY: output}
    return {f"{ACTIVATION_KEY}/{jax.tree_util.keystr(path, simple=True, separator='/')}": leaf
            for path, leaf in leaves}


#: The carry of a :class:`StatefulModule` (its ``state`` argument, what
#: ``initialize_state`` returns): any JAX pytree whose leaves have the batch
#: ``[B, ...]`` as their leading axis, ``()`` for a module without state.
ModuleState: TypeAlias = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StatefulModuleOutput(JaxDataclass):
    """What one forward step of a :class:`StatefulModule` returns (a pytree).

    ``out.replace(output=...)`` returns a copy with fields changed. Fields may
    be given by keyword or by position, in the order below (the original
    nnx-ppo's order).

    Attributes:
      next_state: carry for the next step; leaves ``[B, ...]``; ``()`` when the
        module has no state.
      output: the module's output; leaves ``[B, ...]``.
      regularization_loss: scalar added to the training loss (already weighted
        and averaged over the batch), e.g. an entropy bonus or a KL term.
      metrics: scalars to log (averaged over steps by the trainer).
      rollout_extras: data recorded during the rollout and fed back to the
        module in the loss replay (and to ``update_statistics``); leaves
        ``[B, ...]``. ``None`` when the module records nothing.
    """

    next_state: ModuleState
    output: Any
    regularization_loss: jax.Array | float = 0.0
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    rollout_extras: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PPONetworkOutput(JaxDataclass):
    """The output a network trained by PPO must produce.

    Fields by keyword or by position, in the order below (the original's).

    Attributes:
      actions: actions sent to the environment, ``[B, ...]`` (a pytree when
        the action space is a dict).
      loglikelihoods: log-probability of ``actions`` under the policy, ``[B]``
        (same tree as ``actions``' top level when several samplers are mapped).
      value_estimates: state-value estimates, ``[B]`` (or a dict of ``[B]``
        for pytree rewards).
    """

    actions: Any
    loglikelihoods: Any
    value_estimates: Any


class StatefulModule(nnx.Module):
    """Base class for every network piece: an NNX module with an explicit carry.

    Subclasses implement ``__call__`` and, when they have state,
    ``initialize_state`` and ``reset_state``. Modules with running statistics
    implement ``update_statistics``. Defaults describe a stateless module whose
    carry is ``()``.
    """

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        """One step on a ``[B, ...]`` batch. See the module docstring."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def initialize_state(self, batch_size: int) -> Any:
        """Return the carry for ``batch_size`` fresh envs (leaves ``[B, ...]``)."""
        return ()

    def reset_state(self, prev_state: Any) -> Any:
        """Return the carry for envs that start a new episode.

        Batched in, batched out: the trainer calls this on the whole batch and
        keeps the result only where an episode ended. The default re-initializes.
        """
        if not jax.tree.leaves(prev_state):
            return prev_state
        return self.initialize_state(batch_size_of(prev_state))

    def update_statistics(self, rollout_extras: Any) -> None:
        """Fold a rollout's ``[T, B, ...]`` extras into running statistics."""
        return None

    def replay_sequence(self, carry: Any, xs: Any, rollout_extras: Any, reset: jax.Array,
                        stored_carry: Any) -> "SequenceOutput":
        """Re-run a whole ``[T, M]`` stretch of a rollout (the loss replay).

        Args:
          carry: the carry entering the first step, leaves ``[M, ...]``.
          xs: inputs at every step, leaves ``[T, M, ...]``.
          rollout_extras: what this module emitted in the rollout, ``[T, M, ...]``
            (``None`` if nothing).
          reset: ``[T, M]`` bool, the carry was reset before step ``t``.
          stored_carry: the rollout's carry entering each step, ``[T, M, ...]``:
            exact at step 0 and wherever ``reset`` (where the replay reads it);
            a leaf whose reset value depends on the parameters only holds that
            value at the other steps.

        It must equal calling ``__call__`` step by step with resets (what
        :func:`replay_in_time` does, the default). A module without carry
        leaves runs once on the flattened ``[T * M]`` batch instead, and
        containers replay each child separately, so stateless stretches of a
        network need no scan over time. Override it only to go faster.
        """
        if not jax.tree.leaves(carry):
            return replay_flat(self, carry, xs, rollout_extras, reset, stored_carry)
        return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)


def batch_size_of(tree: Any) -> int:
    """The leading-axis size shared by the leaves of ``tree`` (an int, or a
    symbolic dimension while ``jax.export`` traces for any batch size)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError("cannot infer a batch size from an empty tree")
    return jnp.shape(leaves[0])[0]


def as_rngs(rngs: Any) -> nnx.Rngs:
    """``rngs`` itself, or ``nnx.Rngs(rngs)`` for an int seed."""
    return rngs if isinstance(rngs, nnx.Rngs) else nnx.Rngs(rngs)


def split_key_carry(owner: str, keys: Any, batch_size: int, name: str = "state") -> tuple[jax.Array, jax.Array]:
    """Check a per-env key carry and split it: ``[B]`` typed keys ->
    (next keys ``[B]``, sample keys ``[B]``). Errors name ``owner`` and ``name``."""
    if not (hasattr(keys, "dtype") and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)):
        raise ValueError(f"{owner}: {name} must be a typed PRNG key array of shape (B,) "
                         f"(from initialize_state), got {keys!r}")
    if tuple(keys.shape) != (batch_size,):
        raise ValueError(f"{owner}: {name} has shape {tuple(keys.shape)}, expected "
                         f"({batch_size},) (one key per env, B from x)")
    both = jax.vmap(jax.random.split)(keys)  # [B, 2]
    return both[:, 0], both[:, 1]


# ------------------------------------------------------------------------------------------------ the replay machinery
# How a whole stored sequence [T, M] is replayed for the loss; StatefulModule.replay_sequence says what.

_UNROLL = contextvars.ContextVar("nnx_ppo_replay_unroll", default=1)


def scan_unroll() -> int:
    """The ``unroll`` a replay's ``lax.scan`` over time uses: what the trainer
    asks for (``PPOConfig.replay_unroll``) while it traces the loss replay,
    1 otherwise. A module whose ``replay_sequence`` scans time passes it on:
    ``jax.lax.scan(step, carry, xs, unroll=scan_unroll())``."""
    return _UNROLL.get()


@contextlib.contextmanager
def unrolled(unroll: int):
    """Within this block :func:`scan_unroll` returns ``unroll`` (the trainer
    traces the loss replay inside it)."""
    token = _UNROLL.set(unroll)
    try:
        yield
    finally:
        _UNROLL.reset(token)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class SequenceOutput:
    """What :meth:`StatefulModule.replay_sequence` returns.

    Attributes:
      output: the module's outputs at every step, leaves ``[T, M, ...]``.
      regularization_loss: scalar, the module's ``regularization_loss`` averaged over steps.
      metrics: scalars, averaged over steps.
      carry: the carry the replay computed entering each step, before a reset
        was applied (leaves ``[T, M, ...]``; the stored carry for modules
        without state). Used by the consistency checker.
    """

    output: Any
    regularization_loss: jax.Array
    metrics: dict[str, Any]
    carry: Any


def select_where(mask: jax.Array, if_true: Any, if_false: Any) -> Any:
    """Per-env select over two trees of ``[B, ...]`` leaves with a ``[B]`` mask.

    Works for float, integer, boolean and typed-PRNG-key leaves.
    """

    def pick(a, b):
        m = jnp.reshape(mask, mask.shape + (1,) * (jnp.ndim(b) - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, if_true, if_false)


def flatten_time(tree: Any, T: int, M: int) -> Any:
    """``[T, M, ...]`` leaves to ``[T * M, ...]``."""
    return jax.tree.map(lambda x: jnp.reshape(x, (T * M,) + x.shape[2:]), tree)


def unflatten_time(tree: Any, T: int, M: int) -> Any:
    """``[T * M, ...]`` leaves to ``[T, M, ...]``."""
    return jax.tree.map(lambda x: jnp.reshape(x, (T, M) + x.shape[1:]), tree)


def straight_through(stored: Any, recomputed: Any) -> Any:
    """Value of ``stored``, gradient of ``recomputed`` for float leaves;
    other leaves (integers, PRNG keys) are taken from ``stored``."""

    def leaf(s, r):
        if jnp.issubdtype(s.dtype, jnp.floating):
            return s + (r - jax.lax.stop_gradient(r))
        return s

    return jax.tree.map(leaf, stored, recomputed)


def replay_in_time(module: nnx.Module, carry, xs, rollout_extras, reset, stored_carry) -> SequenceOutput:
    """Reference replay: scan ``module`` over time, one step at a time.

    Before step ``t`` the carry of envs with ``reset[t]`` is replaced by the
    stored post-reset carry (value) with the gradient of a recomputed
    ``reset_state``. The module's own variables ride along in the scan carry so
    a ``reset_state`` that advances its ``nnx.Rngs`` traces cleanly; those
    updates are discarded. Writes made by ``__call__`` are kept: after the
    scan, ``module`` holds the values its last step left, as after a
    :func:`replay_flat` (so a caller, e.g. the trainer's replay check, sees
    which variables the forward pass writes).
    """
    graphdef, variables = nnx.split(module)
    written_by_call: set[tuple] = set()  # variable paths __call__ writes (found when the step is traced)

    def step(scan_carry, inputs):
        carry, variables = scan_carry
        x, extras, reset_t, stored = inputs
        m = nnx.merge(graphdef, variables)
        carry_in = select_where(reset_t, straight_through(stored, m.reset_state(carry)), carry)
        out = _call_noting_writes(m, written_by_call, carry_in, x, extras)
        _, variables = nnx.split(m)
        regularization = jnp.asarray(out.regularization_loss, jnp.float32)
        return (out.next_state, variables), (out.output, regularization, out.metrics, carry)

    inputs = (xs, rollout_extras, reset, stored_carry)
    (_, last), (output, regularization, metrics, carries) = jax.lax.scan(step, (carry, variables), inputs,
                                                                         unroll=scan_unroll())
    _keep_writes(module, written_by_call, last)
    return SequenceOutput(
        output=output,
        regularization_loss=jnp.mean(regularization),
        metrics={k: jnp.mean(v) for k, v in metrics.items()},
        carry=carries,
    )


def _call_noting_writes(module: nnx.Module, written: set[tuple], *args) -> Any:
    """``module(*args)``, adding to ``written`` the paths of the variables the
    call writes (while a replay's step is traced)."""
    before = _variable_values(module)
    out = module(*args)
    written.update(path for path, value in _variable_values(module).items() if value is not before[path])
    return out


def _keep_writes(module: nnx.Module, written: set[tuple], last: Any) -> None:
    """Set ``module``'s variables at the ``written`` paths to their values in
    the state ``last`` (what a replay's last step left), so that a caller
    such as the trainer's replay check sees what the forward pass writes."""
    last = dict(nnx.to_flat_state(last))
    for path, variable in nnx.to_flat_state(nnx.state(module)):
        if path in written:
            variable.set_value(last[path].get_value())


def _variable_values(module: nnx.Module) -> dict[tuple, Any]:
    """``{path: value}`` of every NNX variable of ``module`` (a write replaces
    the value object, so identity tells which ones a call wrote)."""
    return {path: variable.get_value() for path, variable in nnx.to_flat_state(nnx.state(module))}


def has_fast_replay(module: nnx.Module, *classes: type) -> bool:
    """Whether ``module``'s forward pass is the one a fast ``replay_sequence``
    written for ``classes`` replays: ``type(module).__call__`` is one of
    theirs. A subclass that overrides ``__call__`` gets ``False`` and must be
    replayed by the generic :func:`replay_in_time`. Containers, recurrent
    layers and the PPO adapter all guard their fast replay with it."""
    return any(type(module).__call__ is cls.__call__ for cls in classes)


def replay_key_chain(module: nnx.Module, keys, xs, rollout_extras, reset, stored_keys) -> SequenceOutput:
    """Replay of a module whose carry is a per-env key chain ``[B]`` that
    ``__call__`` advances with :func:`split_key_carry` whatever the input
    (the stochastic layers, the variational bottleneck).

    Only the chain scans time: a loop of key splits (no input, no gradient)
    gives the key entering every step, the stored key where ``reset`` (the
    value the rollout's reset made). Then ``__call__`` runs for all ``T``
    steps at once, ``vmap``-ed over time with each step's ``[M]`` batch, so
    every step computes what it computed in the rollout, and the losses and
    metrics are averaged over steps as :func:`replay_in_time` averages them;
    a variable ``__call__`` writes holds what the last step wrote (each
    step starting from the values before the replay), so that the replay
    check sees the write, as with :func:`replay_in_time`.
    A replay unrolled over time would copy the whole call ``T`` times.
    """
    name = type(module).__name__

    def advance(k, inputs):
        reset_t, stored = inputs
        k_in = select_where(reset_t, stored, k)
        return split_key_carry(name, k_in, k_in.shape[0])[0], (k_in, k)

    _, (keys_in, carries) = jax.lax.scan(advance, keys, (reset, stored_keys))
    graphdef, variables = nnx.split(module)
    written_by_call: set[tuple] = set()  # variable paths __call__ writes (found when the step is traced)

    def one_step(k, x, extras, variables):  # (variables as an argument: fresh inside the trace, so writable)
        m = nnx.merge(graphdef, variables)
        out = _call_noting_writes(m, written_by_call, k, x, extras)
        return (out.output, jnp.asarray(out.regularization_loss, jnp.float32), out.metrics), nnx.split(m)[1]

    (output, regularization, metrics), after = jax.vmap(one_step, in_axes=(0, 0, 0, None))(
        keys_in, xs, rollout_extras, variables)
    if written_by_call:  # (only then slice the last step's values out of every variable)
        _keep_writes(module, written_by_call, jax.tree.map(lambda v: v[-1], after))
    return SequenceOutput(
        output=output,
        regularization_loss=jnp.mean(regularization),
        metrics={k: jnp.mean(v) for k, v in metrics.items()},
        carry=carries,
    )


def replay_flat(module: nnx.Module, carry, xs, rollout_extras, reset, stored_carry) -> SequenceOutput:
    """Replay of a module without carry leaves: one call on the flattened
    ``[T * M]`` batch instead of a scan over time."""
    T, M = reset.shape
    out = module(carry, flatten_time(xs, T, M), None if rollout_extras is None else flatten_time(rollout_extras, T, M))
    return SequenceOutput(
        output=unflatten_time(out.output, T, M),
        regularization_loss=jnp.asarray(out.regularization_loss, jnp.float32),
        metrics={k: jnp.mean(v) for k, v in out.metrics.items()},
        carry=stored_carry,
    )
