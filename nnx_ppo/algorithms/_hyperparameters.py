"""Hyperparameters that may differ between the members of one compiled program.

A population (:func:`~nnx_ppo.algorithms.population.train_population`)
trains members whose :class:`~nnx_ppo.algorithms.config.PPOConfig` differ
only in numbers that change no array shape and no part of the program
(:data:`PER_MEMBER`). Each member's numbers ride in its
:class:`~nnx_ppo.algorithms.ppo.TrainingState` as float32 scalars
(``state.member``, a :class:`MemberState`; ``[N]`` stacked over the
members), and the iteration reads them from there
(:func:`~nnx_ppo.algorithms.ppo.with_hyperparameters`), so that one trace
serves every member and population-based training
(:mod:`nnx_ppo.algorithms.population`) can change them on device.

Anything else (``n_envs``, ``rollout_length``, the minibatches, flags such
as ``normalize_advantages``, a field being ``None`` for one member and a
number for another) changes the program: :func:`check_population` refuses it
with a :class:`PopulationConfigError` naming the fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig, per_member_bounds

__all__ = ["PER_MEMBER", "PopulationConfigError"]

PER_MEMBER: tuple[str, ...] = tuple(per_member_bounds())
"""The :class:`PPOConfig` fields that may differ between members (numbers
only: a learning-rate schedule, a callable, must be the same object for all;
an optional field must be ``None`` for all members or a number for all)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class MemberState:
    """A population member's own part of its training state.

    Attributes:
      hyperparameters: ``{PPOConfig field: float32 []}``, its :data:`PER_MEMBER` numbers.
      score: float32 ``[]``, a running mean of its training episode returns
        (what population-based training ranks by; NaN before an episode ended).
      parent: int32 ``[]``, the member whose state it last took over in
        population-based training (its own index until then).
    """

    hyperparameters: dict[str, jax.Array]
    score: jax.Array
    parent: jax.Array


def initial_member_state(config: TrainConfig, index: int) -> MemberState:
    """Member ``index``'s state at the start: its config's numbers, no score, its own parent."""
    return MemberState(hyperparameters=hyperparameters_of(config.ppo), score=jnp.asarray(jnp.nan, jnp.float32),
                       parent=jnp.asarray(index, jnp.int32))


class PopulationConfigError(ValueError):
    """The members' configs differ in fields that change the compiled program
    (array shapes, flags, settings of the run); the message names them."""


def _differing(first: Any, other: Any, prefix: str = "") -> list[str]:
    """Dotted names of the (nested dataclass) fields where ``other`` differs from ``first``."""
    names = []
    for field in dataclasses.fields(first):
        a, b = getattr(first, field.name), getattr(other, field.name)
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            names += _differing(a, b, f"{prefix}{field.name}.")
        elif a != b:
            names.append(f"{prefix}{field.name}")
    return names


def check_population(configs: Sequence[TrainConfig]) -> None:
    """Refuse members whose configs differ in anything but :data:`PER_MEMBER`
    numbers (and ``seed``).

    Raises:
      PopulationConfigError: naming every field that differs and may not, and
        the fields that may.
    """
    if not configs:
        raise PopulationConfigError("a population needs at least one config")
    first = configs[0]
    refused: list[str] = []
    for other in configs[1:]:
        for name in _differing(first, other):
            field = name.removeprefix("ppo.")
            a, b = getattr(first.ppo, field, None), getattr(other.ppo, field, None)
            numeric = not (callable(a) or callable(b) or a is None or b is None)
            if name == "seed" or (name.startswith("ppo.") and field in PER_MEMBER and numeric):
                continue
            if name not in refused:
                refused.append(name)
    if refused:
        raise PopulationConfigError(
            f"the members' configs differ in {', '.join(refused)}, which change array shapes or the compiled "
            f"program; only these numbers may differ per member: {', '.join('ppo.' + n for n in PER_MEMBER)} "
            "(an optional one set for every member, a learning-rate schedule shared). Train such variants as "
            "separate runs")


def hyperparameters_of(ppo: PPOConfig) -> dict[str, jnp.ndarray]:
    """``{field: float32 scalar}`` of ``ppo``'s :data:`PER_MEMBER` numbers (a
    field left ``None``, or a learning-rate schedule, is not included)."""
    values = {}
    for name in PER_MEMBER:
        value = getattr(ppo, name)
        if value is not None and not callable(value):
            values[name] = jnp.asarray(value, jnp.float32)
    return values


def member_entry(config: TrainConfig) -> dict[str, Any]:
    """What a run records of one member (JSON): its ``seed`` and its
    :data:`PER_MEMBER` numbers as set at the start, ``{"seed": 3,
    "hyperparameters": {"learning_rate": 0.001, ...}}``."""
    values = {name: float(getattr(config.ppo, name)) for name in hyperparameters_of(config.ppo)}
    return {"seed": int(config.seed), "hyperparameters": values}
