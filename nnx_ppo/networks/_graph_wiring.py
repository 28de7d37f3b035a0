"""The wiring of a :class:`~nnx_ppo.networks.graph.PopulationGraph` (internal):
its declarations, their argument checks and the order of the populations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

__all__ = ["INPUT", "HIDDEN", "OUTPUT", "Population", "Connection", "check_name", "check_size", "check_activation",
           "topological_order"]

INPUT, HIDDEN, OUTPUT = "input", "population", "output"


class Population(NamedTuple):
    """A declared population: its name, kind, size, activation and I/O key."""

    name: str
    kind: str  # INPUT, HIDDEN or OUTPUT
    size: int
    activation: Callable[[jax.Array], jax.Array] | None
    io_key: str | None  # input_from / output_to as given (None: use the name)


class Connection(NamedTuple):
    """A declared projection ``src -> dst`` with its name and delay."""

    name: str
    src: str
    dst: str
    delay: int


def check_name(kind: str, name: Any) -> str:
    """``name`` if it is a non-empty str (else a TypeError naming the ``kind``)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"PopulationGraph: {kind} name must be a non-empty str, got {name!r}")
    return name


def check_size(name: str, size: Any) -> int:
    """``size`` if it is a positive int (else a ValueError naming the population)."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"PopulationGraph: size of population {name!r} must be a positive int, got {size!r}")
    return size


def check_activation(name: str, activation: Any) -> Any:
    """``activation`` if it is callable or None (else a TypeError naming the population)."""
    if activation is not None and not callable(activation):
        raise TypeError(
            f"PopulationGraph: activation of population {name!r} must be callable or None, "
            f"got {type(activation).__name__}"
        )
    return activation


def topological_order(names: list[str], edges: list[tuple[str, str]]) -> tuple[str, ...]:
    """Kahn's algorithm on the delay-0 ``(src, dst)`` edges, the earliest of
    ``names`` first; a ValueError names a cycle."""
    remaining = list(names)
    order: list[str] = []
    while remaining:
        ready = next((n for n in remaining
                      if not any(dst == n and src in remaining for src, dst in edges)), None)
        if ready is None:
            raise ValueError(
                "PopulationGraph: delay-0 connections form a cycle "
                f"{' -> '.join(_find_cycle(remaining, edges))}; "
                "give at least one connection on it delay >= 1"
            )
        order.append(ready)
        remaining.remove(ready)
    return tuple(order)


def _find_cycle(remaining: list[str], edges: list[tuple[str, str]]) -> list[str]:
    # Every remaining population has a delay-0 predecessor among the remaining
    # ones, so walking backwards must revisit a population.
    path = [remaining[0]]
    while True:
        pred = next(src for src, dst in edges if dst == path[-1] and src in remaining)
        if pred in path:
            cycle = path[path.index(pred):] + [pred]
            return cycle[::-1]
        path.append(pred)
