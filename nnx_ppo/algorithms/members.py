"""Who trains and how they fail: one code path for 1..N members.

One plain run is one member; a seed batch
(:func:`~nnx_ppo.algorithms.seeds.train_seeds`) or a population
(:func:`~nnx_ppo.algorithms.population.train_population`) is N, whose
state has a leading member axis ``[S, ...]``. :func:`gather_members` builds
the :class:`Members` the trainer (:func:`nnx_ppo.algorithms.trainer.train`)
runs; the rest of this module starts, resumes and writes back their state,
and turns a member's :class:`~nnx_ppo.algorithms.driver.Failure` into what
is logged (:func:`failure_metrics`), remembered on resume
(:func:`earlier_failures`) and raised by one plain run (:func:`run_failure`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.driver import Failure, NonFiniteError, ReplayMismatchError
from nnx_ppo.algorithms.functional import NetworkFn, copy_tree
from nnx_ppo.algorithms.hyperparameters import check_population, initial_member_state
from nnx_ppo.algorithms.outputs import FAILURE_KEY
from nnx_ppo.algorithms.program import seed_slice, stack_trees
from nnx_ppo.algorithms.rollout import all_finite
from nnx_ppo.algorithms.sharding import replicated
from nnx_ppo.algorithms.state import TrainingState

__all__ = ["Members", "gather_members", "initial_state", "resume_state", "resumed", "write_back", "member_row",
           "failure_metrics", "earlier_failures", "run_failure", "named_replay_error", "CheckpointDirInUseError",
           "check_fresh_checkpoint_dir"]


class CheckpointDirInUseError(ValueError):
    """A run that starts from scratch was given a ``checkpoint_dir`` that
    already holds another run's checkpoints (which it would prune)."""


def check_fresh_checkpoint_dir(checkpoint_dir: str) -> None:
    """Refuse to start a fresh run in a directory holding checkpoints:
    keeping only the newest ``keep_checkpoints`` would delete the other
    run's, or this run's own when the other's steps are higher."""
    from nnx_ppo.algorithms import checkpointing

    what = checkpointing.held_checkpoints(checkpoint_dir)
    if what is not None:
        raise CheckpointDirInUseError(
            f"checkpoint_dir {os.fspath(checkpoint_dir)!r} already holds {what} of another run; a fresh run "
            "would prune them. Continue that run with resume_from=checkpoint_dir, or give an empty directory")


@dataclasses.dataclass(frozen=True)
class Members:
    """Who trains, one code path for 1..N members.

    Attributes:
      names: what logs, checkpoints and failure rows call each member: the
        seeds of a batch, the member indices of a population, ``[None]`` for
        one plain run.
      configs: each member's config (its ``seed`` is the one its network and
        state start from).
      networks: each member's network, all of one structure.
      graphdef: their structure in training mode.
      stacked: whether the state has a leading member axis ``[S, ...]`` (a
        batch); one plain run's state has none, so that it compiles
        exactly the program a single network runs.
    """

    names: list[int | None]
    configs: list[TrainConfig]
    networks: list
    graphdef: Any
    stacked: bool

    def part(self, tree: Any, index: int) -> Any:
        """Member ``index``'s part of a state (or any tree laid out like one)."""
        return seed_slice(tree, index) if self.stacked else tree

    def state(self, states: list[TrainingState]) -> TrainingState:
        """The members' states as one state."""
        return stack_trees(states) if self.stacked else states[0]


def gather_members(network, make_network, seeds, members, config: TrainConfig) -> Members:
    """One run (``network``), a seed batch (``make_network`` and ``seeds``,
    checked by :func:`~nnx_ppo.algorithms.config.check_seeds`) or a
    population (and ``members``: one config per seed) as :class:`Members`; a
    batch's networks are built here (``make_network(nnx.Rngs(seed))``) and
    must share one structure."""
    if seeds is None:
        return Members(names=[None], configs=[config], networks=[network],
                        graphdef=NetworkFn.of(network, deterministic=False).graphdef, stacked=False)
    if members is None:
        configs = [dataclasses.replace(config, seed=s) for s in seeds]
    else:
        configs = list(members)
        check_population([config, *configs])
        if len(configs) != len(seeds):
            raise ValueError(f"train: {len(configs)} member configs for {len(seeds)} members")
    networks = [make_network(nnx.Rngs(c.seed)) for c in configs]
    graphdef = NetworkFn.of(networks[0], deterministic=False).graphdef
    for c, net in zip(configs[1:], networks[1:]):
        if NetworkFn.of(net, deterministic=False).graphdef != graphdef:
            raise ValueError(f"train_seeds: make_network(nnx.Rngs({c.seed})) built a network whose structure "
                             f"differs from seed {configs[0].seed}'s; every seed must build the same architecture")
    return Members(names=list(seeds), configs=configs, networks=networks, graphdef=graphdef, stacked=True)


def initial_state(algorithm: Any, env, members: Members, population: bool) -> TrainingState:
    """The members' fresh state (a population's members each with their
    own hyperparameters in it)."""
    states = [algorithm.initial_state(env, net, config) for net, config in zip(members.networks, members.configs)]
    if population:
        states = [dataclasses.replace(s, member=initial_member_state(c, i))
                  for i, (s, c) in enumerate(zip(states, members.configs))]
    return members.state(states)


def resume_state(resume_from: str, checkpoint_dir: str | None, state: TrainingState, ppo: PPOConfig) -> TrainingState:
    """Restore ``state`` from ``resume_from``; warn when the directory also
    holds checkpoints later than the one resumed from. A change of ``n_envs``
    or ``rollout_length`` (the size of an iteration) is refused before
    anything is read or written."""
    from nnx_ppo.algorithms import checkpointing

    # Only the sizes are compared: a placeholder rate lets a config saved with a schedule (not saved) load.
    saved = checkpointing.load_config(resume_from, learning_rate=1.0).ppo
    for name in ("n_envs", "rollout_length"):
        if getattr(saved, name) != getattr(ppo, name):
            raise ValueError(
                f"cannot resume with PPOConfig.{name}={getattr(ppo, name)}: the checkpoint in {str(resume_from)!r} "
                f"was trained with {name}={getattr(saved, name)} (its iteration count is in iterations of "
                f"{saved.steps_per_iteration} env steps); keep {name}, or start a new run from its network"
            )
    state = checkpointing.restore_training_state(resume_from, state)
    steps = int(jnp.max(state.iteration)) * ppo.steps_per_iteration  # (a seed batch has one per seed)
    newer = [s for s, _ in checkpointing.list_checkpoints(checkpoint_dir or resume_from) if s > steps]
    if newer:
        warnings.warn(
            f"resumed from step {steps}, but the checkpoint directory also holds later checkpoints "
            f"(steps {newer}) from the run being branched off; latest_checkpoint() will pick those until "
            "newer ones are written. Remove them, or checkpoint this branch into another directory.",
            stacklevel=4,
        )
    return state


def resumed(state: TrainingState, members: Members, resume_from: str, checkpoint_dir: str | None,
             ppo: PPOConfig, entries: list[dict] | None = None) -> TrainingState:
    """``state`` restored from ``resume_from`` (a seed batch only from a
    checkpoint of the same seeds, a population only from one of the same members)."""
    if members.stacked:
        from nnx_ppo.algorithms import checkpointing

        metadata = checkpointing.load_metadata(resume_from) or {}
        saved = metadata.get("seeds")
        if entries is not None and metadata.get("members") != entries:
            raise ValueError(f"train_population: cannot resume these members from {str(resume_from)!r}, which "
                             f"holds {metadata.get('members') or 'no population'}; resume with its configs and seeds")
        if saved != members.names:
            raise ValueError(f"train_seeds: cannot resume seeds {members.names} from {str(resume_from)!r}, which "
                             f"holds {'seeds ' + str(saved) if saved else 'a single-seed run'}; resume with its seeds")
    return resume_state(resume_from, checkpoint_dir, state, ppo)


def write_back(members: Members, state: TrainingState, mesh) -> None:
    """Copies of ``state``'s variables into the networks (each member's into
    its own), unless they were donated or are not finite."""
    latest = (state.params, state.rest)
    if any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(latest)):
        return
    latest = replicated(latest, mesh) if members.stacked else latest
    for i, net in enumerate(members.networks):
        own = members.part(latest, i)
        if bool(jax.jit(all_finite)(own)):
            nnx.update(net, *copy_tree(own))


def member_row(row: dict[str, Any], index: int) -> dict[str, float]:
    """Member ``index``'s row of host metrics (a batch's are ``[S]`` arrays; one run's are scalars)."""
    return {k: float(v[index]) if np.ndim(v) else float(v) for k, v in row.items()}


def failure_metrics(failure: Failure) -> dict[str, str]:
    """The failure row's own fields: ``{"failure": reason, "failure_type": "NonFiniteError"}``."""
    return {FAILURE_KEY: str(failure.error), "failure_type": type(failure.error).__name__}


def earlier_failures(rows: dict[Any, dict[str, Any]], seeds: list[int], up_to_steps: int) -> dict[int, Failure]:
    """The failures a run directory's failure ``rows`` (seed -> row) record (seed index ->
    :class:`Failure`), up to the env step a resumed run continues from (a
    later one is trained again, and found again)."""
    kinds = {"NonFiniteError": NonFiniteError, "ReplayMismatchError": ReplayMismatchError}
    failures = {}
    for seed, row in rows.items():
        if seed in seeds and int(row["env_steps"]) <= up_to_steps:
            error = kinds.get(row.get("failure_type"), RuntimeError)(row[FAILURE_KEY])
            failures[seeds.index(seed)] = Failure(iteration=int(row["iteration"]), env_steps=int(row["env_steps"]),
                                                  error=error)
    return failures


def run_failure(failure: Failure, network, env, ppo: PPOConfig) -> Exception:
    """The error one plain run raises for its ``failure``: a replay
    mismatch with the module named, a non-finite value with where the
    network's parameters come from."""
    if isinstance(failure.error, ReplayMismatchError):
        return named_replay_error(failure.error, network, env, ppo)
    healthy = failure.iteration - 1
    return type(failure.error)(f"{failure.error}. The network holds the last finite parameters and statistics, "
                               f"from iteration {healthy} ({healthy * ppo.steps_per_iteration} env steps)")


def named_replay_error(err: ReplayMismatchError, network, env, ppo: PPOConfig) -> ReplayMismatchError:
    """The health check's replay mismatch with the module named: the
    carry leaf the replay first departs from and the module that owns it
    (:func:`~nnx_ppo.algorithms.replay_diagnosis.diagnose_replay`, one small
    rollout of ``network`` on ``env``); ``err`` as it is if nothing is found."""
    from nnx_ppo.algorithms.replay_diagnosis import diagnose_replay

    n_envs = min(ppo.n_envs, 8)
    try:
        found = diagnose_replay(network, env, n_envs=n_envs, rollout_length=ppo.rollout_length,
                                n_minibatches=2 if n_envs % 2 == 0 else 1)
    except ReplayMismatchError as named:  # a module writing a variable, named when the replay compiles
        return named
    except Exception:  # noqa: BLE001 -- the diagnosis is best effort; the mismatch itself stands
        return err
    if found.first_divergence is None:
        return err
    return ReplayMismatchError(f"{err} First divergence: {found.first_divergence}")
