"""Population-based training (PBT) inside the compiled program.

After every iteration of a population
(:func:`~nnx_ppo.algorithms.population.train_population`),
:func:`population_step` folds each member's training episode return into its
running ``score``; every ``PBTConfig.every_iterations`` iterations the worst
``fraction`` of the members (by score) each take over the whole training
state of a member drawn from the best ``fraction`` (parameters, optimizer
state, env states and network carries, return statistics, score), keep their
own PRNG key, and perturb the copied hyperparameters (*exploit and explore*,
Jaderberg et al. 2017). All of it runs on device, between two iterations of
the same ``fori_loop``; the draws come from ``PBTConfig.seed`` and the
iteration, so a resumed population repeats them.

Every member's iteration metrics gain ``population/score``,
``population/parent`` (the member it last took over) and
``hyperparameters/<field>``: its lineage and hyperparameters over time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from nnx_ppo.algorithms.driver import IterationOutput
from nnx_ppo.algorithms.hyperparameters import PER_MEMBER
from nnx_ppo.algorithms.state import TrainingState

__all__ = ["PBTConfig", "BOUNDS", "population_step"]

BOUNDS: dict[str, tuple[float, float]] = {
    "learning_rate": (1e-6, 1e-1),
    "clip_range": (0.02, 0.5),
    "critic_loss_weight": (0.05, 5.0),
    "discounting_factor": (0.8, 0.9995),
    "gae_lambda": (0.5, 1.0),
    "value_clip_range": (0.02, 2.0),
    "gradient_clipping": (0.05, 10.0),
    "target_kl": (1e-3, 0.5),
    "regularization_weight": (0.0, 100.0),
    "reward_scale": (1e-3, 1e3),
}
"""The range PBT keeps each perturbed hyperparameter in (a member starting
outside it stays where it is until perturbed)."""

_TOWARDS_ONE = ("discounting_factor", "gae_lambda")  # perturbed as 1 - x: the horizon, not the number near 1


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """Population-based training.

    Attributes:
      every_iterations: iterations between two exploit-and-explore steps.
      fraction: the share of members replaced each time (the worst), and the
        share they copy from (the best); at least one member each.
      perturb_factors: a copied hyperparameter is multiplied by one of these,
        drawn with equal chance (discount and GAE lambda: their distance to 1
        is), then clipped to :data:`BOUNDS`.
      fields: the hyperparameters to perturb (default: those that differ
        between the members at the start; the learning rate if none do).
      score_smoothing: weight of the newest iteration's mean training
        episode return in the running score.
      seed: seeds the choice of members and factors.
    """

    every_iterations: int
    fraction: float = 0.25
    perturb_factors: tuple[float, float] = (0.8, 1.25)
    fields: tuple[str, ...] | None = None
    score_smoothing: float = 0.2
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.every_iterations, bool) or not isinstance(self.every_iterations, int) or (
                self.every_iterations <= 0):
            raise ValueError(f"PBTConfig.every_iterations must be a positive integer, got {self.every_iterations!r}")
        if not 0 < self.fraction <= 0.5:
            raise ValueError(f"PBTConfig.fraction must be in (0, 0.5], got {self.fraction}")
        if not all(f > 0 and math.isfinite(f) for f in self.perturb_factors):
            raise ValueError(f"PBTConfig.perturb_factors must be positive numbers, got {self.perturb_factors}")
        if not 0 < self.score_smoothing <= 1:
            raise ValueError(f"PBTConfig.score_smoothing must be in (0, 1], got {self.score_smoothing}")
        unknown = [f for f in self.fields or () if f not in PER_MEMBER]
        if unknown:
            raise ValueError(f"PBTConfig.fields: {unknown} cannot differ per member; choose from {list(PER_MEMBER)}")


def _perturbed(name: str, value: jax.Array, factor: jax.Array) -> jax.Array:
    """``value`` times ``factor`` (for discount and lambda: ``1 - value``
    times it), clipped to the field's bounds."""
    low, high = BOUNDS[name]
    new = 1.0 - (1.0 - value) * factor if name in _TOWARDS_ONE else value * factor
    return jnp.clip(new, low, high)


def _exploit_and_explore(state: TrainingState, pbt: PBTConfig, fields: Sequence[str]) -> TrainingState:
    """The worst members take over the states of members drawn from the best
    ones and perturb the hyperparameters in ``fields`` (leaves ``[N, ...]``)."""
    member = state.member
    n = member.score.shape[0]
    k = max(1, int(n * pbt.fraction))
    key = jax.random.fold_in(jax.random.key(pbt.seed), jnp.max(state.iteration))
    pick_key, factor_key = jax.random.split(key)
    order = jnp.argsort(jnp.where(jnp.isnan(member.score), -jnp.inf, member.score))  # worst first
    sources = order[n - k:][jax.random.randint(pick_key, (k,), 0, k)]
    source = jnp.arange(n).at[order[:k]].set(sources)  # member i takes over member source[i]
    copied = source != jnp.arange(n)
    taken = jax.tree.map(lambda x: x[source], state)
    factors = jnp.asarray(pbt.perturb_factors, jnp.float32)[
        jax.random.randint(factor_key, (len(fields), n), 0, len(pbt.perturb_factors))]
    values = dict(taken.member.hyperparameters)
    for factor, name in zip(factors, fields):
        values[name] = jnp.where(copied, _perturbed(name, values[name], factor), values[name])
    new_member = dataclasses.replace(taken.member, hyperparameters=values,
                                     parent=jnp.where(copied, source, member.parent).astype(jnp.int32))
    # Each keeps its own key (the copies then explore apart) and iteration count.
    return dataclasses.replace(taken, key=state.key, iteration=state.iteration, member=new_member)


def population_step(pbt: PBTConfig | None, fields: Sequence[str] = ()) -> Callable:
    """``step(state, output) -> (state, output)`` on a population's stacked
    state and iteration output (leaves ``[N, ...]``), run after every
    iteration: updates the scores, exploits and explores when due (with
    ``pbt``; ``fields`` are perturbed), and adds the population metrics."""
    smoothing = 0.2 if pbt is None else pbt.score_smoothing

    def step(state: TrainingState, output: IterationOutput) -> tuple[TrainingState, IterationOutput]:
        member = state.member
        returns = output.metrics["train/episode_return"]
        ended = output.metrics["train/completed_episodes"] > 0
        running = jnp.where(jnp.isnan(member.score), returns, (1 - smoothing) * member.score + smoothing * returns)
        state = dataclasses.replace(state, member=dataclasses.replace(
            member, score=jnp.where(ended, running, member.score)))
        if pbt is not None and fields:
            due = jnp.max(state.iteration) % pbt.every_iterations == 0
            state = jax.lax.cond(due, lambda s: _exploit_and_explore(s, pbt, fields), lambda s: s, state)
        member = state.member
        metrics = {**output.metrics, "population/score": member.score,
                   "population/parent": member.parent.astype(jnp.float32),
                   **{f"hyperparameters/{k}": v for k, v in member.hyperparameters.items()}}
        return state, dataclasses.replace(output, metrics=metrics)

    return step
