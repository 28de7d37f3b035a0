"""The compiled program: many iterations of any trainer in one XLA call.

A trainer's iteration is a pure ``iteration(state) -> (state,
IterationOutput)`` on a :class:`~nnx_ppo.algorithms.state.TrainingState`.
:func:`compile_iterations` jits up to ``max_iterations`` of them into one
``fn(state, n)`` (a ``fori_loop``, the state donated); for a seed batch
(leaves ``[S, ...]``) it runs them over the seeds with :func:`over_seeds`.
The state (each seed's) stays at its last healthy state once its health
fails (:func:`keep_last_healthy`); :func:`stack_trees` builds such a batch and
:func:`seed_slice` takes one seed's part of it.
:func:`enable_compilation_cache` keeps compiled programs on disk, so a run
of the same program again (same code, shapes, JAX and CPU) skips compiling.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from nnx_ppo.algorithms.config import check_seed_batching
from nnx_ppo.algorithms.distributed import SEED_AXIS

__all__ = ["compile_iterations", "over_seeds", "keep_last_healthy", "stack_trees", "seed_slice",
           "enable_compilation_cache", "default_cache_dir"]


def stack_trees(trees: Sequence[Any]) -> Any:
    """Stack equally shaped pytrees on a new leading axis (PRNG keys included)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree: Any, index: int) -> Any:
    """The ``index``-th entry of every leaf's leading (seed) axis."""
    return jax.tree.map(lambda x: x[index], tree)


def keep_last_healthy(iteration: Callable) -> Callable:
    """``iteration`` that returns its input state unchanged when the
    iteration's health fails (non-finite values, replay mismatch), so a
    failed seed of a batch stays at its last healthy state (with its key,
    so every later iteration repeats the same failure and is discarded too).
    The output (health and metrics) is the failed iteration's."""

    def guarded(state):
        next_state, output = iteration(state)
        ok = output.health.ok
        return jax.tree.map(lambda new, old: jnp.where(ok, new, old), next_state, state), output

    return guarded


def over_seeds(iteration: Callable, seed_batching: str = "vmap", shardings: Any = None) -> Callable:
    """``iteration`` for a state whose leaves have a leading seed axis ``[S, ...]``.

    ``"vmap"``: every operation batched over the seeds. ``"map"``: the seeds
    one after another (``jax.lax.map``), each seed's operations at their own
    size; when ``shardings`` split the seed axis over devices
    (:func:`~nnx_ppo.algorithms.distributed.seed_shardings`), each device runs
    its own seeds in turn (``jax.shard_map``), all devices at once.
    """
    check_seed_batching(seed_batching)
    if seed_batching == "vmap":
        return jax.vmap(iteration)

    def in_turn(state):
        return jax.lax.map(iteration, state)

    mesh = None if shardings is None else jax.tree.leaves(shardings)[0].mesh
    if mesh is None or SEED_AXIS not in mesh.axis_names:
        return in_turn  # one device, or every seed's envs split: XLA partitions each seed's step
    by_seed = PartitionSpec(SEED_AXIS)
    # Nothing crosses devices: each device's seeds are independent trainings.
    return jax.shard_map(in_turn, mesh=mesh, in_specs=by_seed, out_specs=by_seed, check_vma=False)


def compile_iterations(iteration: Callable, max_iterations: int, batched_seeds: bool = False,
                       shardings: Any = None, seed_batching: str = "vmap",
                       population_step: Callable | None = None) -> Callable:
    """Jit ``iteration(state) -> (state, IterationOutput)`` into
    ``fn(state, n) -> (state, IterationOutput)`` running ``n <=
    max_iterations`` iterations in one call (``n`` is a runtime value, so a
    shorter last call does not recompile); output leaves are
    ``[max_iterations, ...]``, rows ``>= n`` unused. The input state's
    buffers are donated. The state is guarded by :func:`keep_last_healthy`:
    an iteration whose health fails leaves it as it was.

    With ``batched_seeds`` every state leaf has a leading seed axis
    ``[S, ...]``: the iteration runs over it as ``seed_batching`` says (see
    :func:`over_seeds`), each seed guarded on its own (outputs
    ``[max_iterations, S, ...]``). With ``shardings`` (see
    :func:`~nnx_ppo.algorithms.distributed.place`) the state keeps that
    sharding in and out, and the outputs are replicated.

    ``population_step(state, output) -> (state, output)`` (a population, see
    :func:`~nnx_ppo.algorithms.population.population_step`) runs on the whole batch
    after every batched iteration: what crosses members (scores, PBT).
    """
    iteration = keep_last_healthy(iteration)
    if batched_seeds:
        iteration = over_seeds(iteration, seed_batching, shardings)
        if population_step is not None:
            batched = iteration
            iteration = lambda state: population_step(*batched(state))  # noqa: E731

    if max_iterations == 1:
        def run(state, n):
            del n
            state, output = iteration(state)
            return state, jax.tree.map(lambda m: m[None], output)
    else:
        def run(state, n):
            shapes = jax.eval_shape(iteration, state)[1]
            buffer = jax.tree.map(lambda m: jnp.zeros((max_iterations,) + m.shape, m.dtype), shapes)

            def body(i, carry):
                state, buffer = carry
                state, output = iteration(state)
                buffer = jax.tree.map(lambda b, m: b.at[i].set(m), buffer, output)
                return state, buffer

            return jax.lax.fori_loop(0, n, body, (state, buffer))

    if shardings is None:
        return jax.jit(run, donate_argnums=0)
    replicated = NamedSharding(jax.tree.leaves(shardings)[0].mesh, PartitionSpec())
    return jax.jit(run, donate_argnums=0, in_shardings=(shardings, replicated), out_shardings=(shardings, replicated))


def default_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/nnx_ppo/jax`` (default ``~/.cache/nnx_ppo/jax``)."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base, "nnx_ppo", "jax")


def enable_compilation_cache(path: str | os.PathLike | None = None, min_compile_seconds: float = 1.0) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in ``path`` (created if needed).

    The cached executable is the one XLA built for the same program, so
    results do not change; only the compile is skipped. ``nnx-ppo`` calls
    this for every command that compiles (docs/cli.md).

    Args:
      path: the cache folder; default :func:`default_cache_dir`.
      min_compile_seconds: programs that compiled faster than this are not stored.

    Returns the folder. Programs compiled after the call are cached (and
    looked up); call it before the first training iteration compiles.
    """
    from jax.experimental.compilation_cache import compilation_cache

    folder = pathlib.Path(path).expanduser() if path is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # so a cache already initialized (or disabled) picks up the new folder
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder
