"""The wiring of a :class:`~nnx_ppo.networks.graph.PopulationGraph` (internal):
its declarations, their argument checks and the order of the populations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

__all__ = ["INPUT", "HIDDEN", "OUTPUT", "Population", "Connection", "check_name", "check_size", "check_activation",
           "topological_order", "check_connection", "PopulationInfo", "ConnectionInfo"]

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


class PopulationInfo(NamedTuple):
    """A population as ``PopulationGraph.populations`` shows it.

    Attributes:
      name: the population's name.
      kind: ``"input"``, ``"population"`` (hidden) or ``"output"``.
      size: the number of units.
      activation: applied once to the summed input (``None``: identity).
      input_from: the key of ``x`` an input population reads (its name
        unless ``input_from=`` was given); ``None`` for other populations.
      output_to: the output key of an output population (its name unless
        ``output_to=`` was given); ``None`` for other populations.
      max_outgoing_delay: the longest delay of its outgoing connections
        (0: it has no delay buffer).
    """

    name: str
    kind: str
    size: int
    activation: Callable[[jax.Array], jax.Array] | None
    input_from: str | None
    output_to: str | None
    max_outgoing_delay: int


class ConnectionInfo(NamedTuple):
    """A connection as ``PopulationGraph.connections`` shows it.

    Attributes:
      name: the connection's name (``"src->dst"`` unless ``name=`` was given).
      src: the source population.
      dst: the target population.
      delay: steps between ``src``'s output and its arrival at ``dst``.
      transform: the module applied to ``src``'s output; ``None`` until
        ``finalize()`` builds the default ``Dense``.
    """

    name: str
    src: str
    dst: str
    delay: int
    transform: Any


def check_connection(populations: tuple[Population, ...], connections: tuple[Connection, ...], src: Any, dst: Any,
                     delay: Any, transform: Any, name: Any) -> str:
    """The name of a connection ``src -> dst`` checked against the
    ``populations`` and ``connections`` declared so far (see
    :meth:`~nnx_ppo.networks.graph.PopulationGraph.connect` for what is refused)."""
    from nnx_ppo.networks.types import StatefulModule

    check_name("source population", src)
    check_name("target population", dst)
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ValueError(f"PopulationGraph: delay of connection {src!r} -> {dst!r} must be an int >= 0, "
                         f"got {delay!r}")
    if transform is not None and not isinstance(transform, StatefulModule):
        raise TypeError(f"PopulationGraph: transform of connection {src!r} -> {dst!r} must be a "
                        f"StatefulModule, got {type(transform).__name__}")
    name = f"{src}->{dst}" if name is None else check_name("connection", name)
    by_name = {p.name: p for p in populations}
    for role, pname in (("source", src), ("target", dst)):
        if pname not in by_name:
            raise ValueError(f"PopulationGraph: connection {name!r} has unknown {role} population "
                             f"{pname!r}; known populations: {list(by_name)} (add populations before "
                             "connecting them)")
    if any(c.name == name for c in connections):
        raise ValueError(f"PopulationGraph: duplicate connection name {name!r}; pass name=... to "
                         "connect() to connect the same pair twice")
    if transform is not None:
        src_size, dst_size = by_name[src].size, by_name[dst].size
        in_f, out_f = getattr(transform, "in_features", None), getattr(transform, "out_features", None)
        if isinstance(in_f, int) and in_f != src_size:
            raise ValueError(f"PopulationGraph: connection {name!r}: transform has in_features={in_f}, "
                             f"expected {src_size} (size of source population {src!r})")
        if isinstance(out_f, int) and out_f != dst_size:
            raise ValueError(f"PopulationGraph: connection {name!r}: transform has out_features={out_f}, "
                             f"expected {dst_size} (size of target population {dst!r})")
    return name
