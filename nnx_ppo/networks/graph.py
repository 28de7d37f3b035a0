"""Brain-like networks: named populations joined by (optionally delayed) projections.

A :class:`PopulationGraph` is built in two phases. First declare populations
and projections (each declaration is checked as it is made); then call
:meth:`PopulationGraph.finalize`, which rejects delay-0 cycles and fixes the
order in which populations are computed within a step::

    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("sensory", 3)
    g.add_population("cortex", 16, activation=jnp.tanh)
    g.add_output("motor", 4)
    g.connect("sensory", "cortex")
    g.connect("cortex", "cortex", delay=1)       # recurrence needs delay >= 1
    g.connect("cortex", "motor")
    g.finalize()

One step: each population (in a topological order of the delay-0
connections) sums the outputs of its incoming projections, adds its external
input if it is an input population, and applies its activation once. A
projection ``src -> dst`` with ``delay=k`` feeds ``dst`` with ``src``'s output
from ``k`` steps earlier (zeros for the first ``k`` steps after
``initialize_state``/``reset_state``) passed through its ``transform``. The
graph outputs ``{output_to or name: [B, size]}`` for its output populations.

The module holds the declarations' records (:class:`Population`,
:class:`Connection`), their argument checks and the order of the
populations, then the graph itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import _original_paths
from nnx_ppo.networks.containers import child_extras, combine_outputs
from nnx_ppo.networks.feedforward import Dense, check_argument, is_int
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, activation_metrics

__all__ = ["PopulationGraph", "PopulationInfo", "ConnectionInfo", "Population", "Connection"]

# A package in the original nnx-ppo 0.3.0: its modules graph.connection, graph.graph and graph.population are
# found on this path (nnx_ppo._original_paths).
__path__ = [_original_paths.PATH]

_INPUT, _HIDDEN, _OUTPUT = "input", "population", "output"


class Population(NamedTuple):
    """A declared population: its name, kind, size, activation and I/O key."""

    name: str
    kind: str  # _INPUT, _HIDDEN or _OUTPUT
    size: int
    activation: Callable[[jax.Array], jax.Array] | None
    io_key: str | None  # input_from / output_to as given (None: use the name)


class Connection(NamedTuple):
    """A declared projection ``src -> dst`` with its name and delay."""

    name: str
    src: str
    dst: str
    delay: int


def _check_name(kind: str, name: Any) -> str:
    """``name`` if it is a non-empty str (else a TypeError naming the ``kind``)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"PopulationGraph: {kind} name must be a non-empty str, got {name!r}")
    return name


def _topological_sort(names: list[str], edges: list[tuple[str, str]]) -> tuple[str, ...]:
    """Kahn's algorithm on the delay-0 ``(src, dst)`` edges, the earliest of
    ``names`` first; a ValueError names a cycle."""
    remaining = list(names)
    order: list[str] = []
    while remaining:
        ready = next((n for n in remaining
                      if not any(dst == n and src in remaining for src, dst in edges)), None)
        if ready is None:
            raise ValueError("PopulationGraph: delay-0 connections form a cycle "
                             f"{' -> '.join(_find_cycle(remaining, edges))}; "
                             "give at least one connection on it delay >= 1")
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


def _check_connection(populations: tuple[Population, ...], connections: tuple[Connection, ...], src: Any, dst: Any,
                      delay: Any, transform: Any, name: Any) -> str:
    """The name of a connection ``src -> dst`` checked against the
    ``populations`` and ``connections`` declared so far (see
    :meth:`~nnx_ppo.networks.graph.PopulationGraph.connect` for what is refused)."""
    _check_name("source population", src)
    _check_name("target population", dst)
    check_argument("PopulationGraph", f"delay of connection {src!r} -> {dst!r}", delay, is_int(delay, 0), "an int >= 0")
    if transform is not None and not isinstance(transform, StatefulModule):
        raise TypeError(f"PopulationGraph: transform of connection {src!r} -> {dst!r} must be a "
                        f"StatefulModule, got {type(transform).__name__}")
    name = f"{src}->{dst}" if name is None else _check_name("connection", name)
    by_name = {p.name: p for p in populations}
    for role, pname in (("source", src), ("target", dst)):
        if pname not in by_name:
            raise ValueError(f"PopulationGraph: connection {name!r} has unknown {role} population "
                             f"{pname!r}; known populations: {list(by_name)} (add populations before "
                             "connecting them)")
    if any(c.name == name for c in connections):
        raise ValueError(f"PopulationGraph: duplicate connection name {name!r}; pass name=... to "
                         "connect() to connect the same pair twice")
    for attribute, role, pname in (("in_features", "source", src), ("out_features", "target", dst)):
        features, size = getattr(transform, attribute, None), by_name[pname].size
        if isinstance(features, int) and features != size:
            raise ValueError(f"PopulationGraph: connection {name!r}: transform has {attribute}={features}, "
                             f"expected {size} (size of {role} population {pname!r})")
    return name


class PopulationGraph(StatefulModule):
    """Named neural populations connected by projections with synaptic delays.

    Build with :meth:`add_input`, :meth:`add_population`, :meth:`add_output`
    and :meth:`connect`, then :meth:`finalize`. Each build call checks its
    own arguments against what is declared so far (duplicate names, unknown
    populations, transform sizes) and raises there; :meth:`finalize` checks
    what needs the whole graph (delay-0 cycles). Using the graph before
    ``finalize`` raises a ``RuntimeError``; building after it, too.
    :attr:`populations` and :attr:`connections` show the declarations.

    Input: a dict read by key (``input_from`` or the population name) or, when
    the graph has a single input population, a bare ``[B, size]`` array. A
    graph without input population only reads the batch size from ``x``.

    Output: always a dict, ``{output_to or name: [B, size]}`` (``{}`` for a
    graph without output population).

    A population with no incoming connection (and no external input) outputs
    its activation of zeros.

    Carry: ``{"buffers": {population: [B, max_delay, size]}, "transforms":
    {connection: carry}}``. A population has a buffer only if one of its
    outgoing projections is delayed; slot ``-k`` holds its output from ``k``
    steps ago. Only stateful transforms (non-empty carry) appear under
    ``"transforms"``. :meth:`reset_state` zeros the buffers and resets the
    transforms.

    Extras and statistics are routed per connection (``{connection: extras}``);
    regularization losses are summed; metrics are prefixed with the
    connection name (``"cortex->motor/kl_divergence"``). Connection names default to
    ``"src->dst"``.

    With ``record_activations`` set (by
    :func:`~nnx_ppo.networks.recording.with_recording`, on a copy), the
    metrics also hold every population's activation,
    one entry per population (``"__activation__/cortex": [B, size]``, see
    :func:`~nnx_ppo.networks.types.activation_metrics`).

    Args:
      rngs: used to initialize the default ``Dense`` transforms (at
        :meth:`finalize`); not kept afterwards.
    """

    def __init__(self, rngs: nnx.Rngs):
        self.record_activations = False
        self._rngs = rngs
        self._finalized = False
        self._populations: tuple[Population, ...] = ()
        self._connections: tuple[Connection, ...] = ()
        # One entry per connection; None where the default Dense is built at finalize.
        self._pending_transforms = nnx.List([])

    # ------------------------------------------------------------------ build

    def _check_building(self, what: str) -> None:
        if self._finalized:
            raise RuntimeError(f"PopulationGraph: cannot {what} after finalize()")

    def _add(self, kind: str, name: str, size: int, activation: Any, io_key: Any) -> None:
        self._check_building(f"add population {name!r}")
        name = _check_name("population", name)
        if io_key is not None:
            _check_name("input_from/output_to", io_key)
        if any(p.name == name for p in self._populations):
            raise ValueError(f"PopulationGraph: duplicate population name {name!r}")
        if kind == _OUTPUT:
            key = io_key or name
            for p in self._populations:
                if p.kind == _OUTPUT and (p.io_key or p.name) == key:
                    raise ValueError(f"PopulationGraph: output populations {p.name!r} and {name!r} "
                                     f"both write output key {key!r}")
        check_argument("PopulationGraph", f"size of population {name!r}", size, is_int(size, 1), "a positive int")
        if activation is not None and not callable(activation):
            raise TypeError(f"PopulationGraph: activation of population {name!r} must be callable or None, "
                            f"got {type(activation).__name__}")
        self._populations = self._populations + (Population(name, kind, size, activation, io_key),)

    def add_input(self, name: str, size: int, *, input_from: str | None = None,
                  activation: Callable[[jax.Array], jax.Array] | None = None) -> None:
        """A population that also receives ``x[input_from or name]`` (``[B, size]``)."""
        self._add(_INPUT, name, size, activation, input_from)

    def add_population(self, name: str, size: int, *,
                       activation: Callable[[jax.Array], jax.Array] | None = None) -> None:
        """A hidden population: the sum of its inputs, through ``activation``
        if given (none by default, as in the original)."""
        self._add(_HIDDEN, name, size, activation, None)

    def add_output(self, name: str, size: int, *, output_to: str | None = None,
                   activation: Callable[[jax.Array], jax.Array] | None = None) -> None:
        """A population whose activity is returned under ``output_to or name``."""
        self._add(_OUTPUT, name, size, activation, output_to)

    def connect(self, src: str, dst: str, *, delay: int = 0, transform: StatefulModule | None = None,
                name: str | None = None, reciprocal: bool = False) -> str:
        """Project ``src`` onto ``dst``; returns the connection name.

        Args:
          src: source population name (added before).
          dst: target population name (added before).
          delay: ``k >= 0``; ``dst`` sees ``src``'s output from ``k`` steps ago.
          transform: a :class:`StatefulModule` mapping ``[B, src_size]`` to
            ``[B, dst_size]``; default ``Dense(src_size, dst_size, rngs)``
            without activation, built at :meth:`finalize`.
          name: the connection name (carry/extras key and metrics prefix);
            default ``"src->dst"``. Needed to connect the same pair twice.
          reciprocal: also project ``dst`` onto ``src`` with the same delay
            (connection ``"dst->src"``), as the original's ``connect`` did;
            each direction gets its own default ``Dense``, so ``transform``
            and ``name`` must be left out.

        Raises ``ValueError`` for an unknown population, a negative delay, a
        duplicate connection name, a transform whose ``in_features`` /
        ``out_features`` disagree with the population sizes, and
        ``reciprocal=True`` with a ``transform`` or a ``name``.
        """
        if reciprocal:
            if transform is not None or name is not None:
                raise ValueError(f"PopulationGraph: connect({src!r}, {dst!r}, reciprocal=True) builds a default "
                                 "Dense for each direction; for a transform or name of your own, call connect "
                                 "once per direction")
            first = self.connect(src, dst, delay=delay)
            self.connect(dst, src, delay=delay)
            return first
        self._check_building(f"connect {src!r} -> {dst!r}")
        name = _check_connection(self._populations, self._connections, src, dst, delay, transform, name)
        self._connections = self._connections + (Connection(name, src, dst, delay),)
        self._pending_transforms.append(transform)
        return name

    def finalize(self) -> PopulationGraph:
        """Build the default transforms and fix the step order.

        Raises ``ValueError`` for a cycle made only of delay-0 connections
        (the message names the populations on the cycle); the other wiring
        mistakes are caught by the build calls. A graph without input or
        output population is accepted. Returns ``self``.
        """
        self._check_building("call finalize() twice: finalize()")
        order = _topological_sort([p.name for p in self._populations],
                                  [(c.src, c.dst) for c in self._connections if c.delay == 0])
        size = {p.name: p.size for p in self._populations}
        # the default Dense transforms drawn from rngs in the order of the connections
        self.transforms = nnx.Dict({c.name: Dense(size[c.src], size[c.dst], self._rngs) if t is None else t
                                    for c, t in zip(self._connections, list(self._pending_transforms))})
        del self._pending_transforms
        del self._rngs
        # Static wiring, kept as tuples (nnx.split/merge sorts dict keys).
        self._order = order
        self._incoming = tuple((name, tuple(c for c in self._connections if c.dst == name)) for name in order)
        self._buffers = tuple((name, info.max_outgoing_delay) for name, info in self.populations.items()
                              if info.max_outgoing_delay > 0)
        self._finalized = True
        return self

    # --------------------------------------------------------------- running

    def _require_finalized(self, what: str) -> None:
        if not self._finalized:
            raise RuntimeError(f"PopulationGraph: call finalize() before {what}")

    @property
    def order(self) -> tuple[str, ...]:
        """Populations in the order they are computed within a step."""
        self._require_finalized("reading the order")
        return self._order

    @property
    def connection_names(self) -> tuple[str, ...]:
        """The connection names, in the order they were connected."""
        return tuple(c.name for c in self._connections)

    @property
    def populations(self) -> Mapping[str, PopulationInfo]:
        """``{name: PopulationInfo}`` in the order the populations were added
        (read-only; see :class:`PopulationInfo`)."""
        return MappingProxyType({
            p.name: PopulationInfo(
                name=p.name, kind=p.kind, size=p.size, activation=p.activation,
                input_from=(p.io_key or p.name) if p.kind == _INPUT else None,
                output_to=(p.io_key or p.name) if p.kind == _OUTPUT else None,
                max_outgoing_delay=max((c.delay for c in self._connections if c.src == p.name), default=0),
            )
            for p in self._populations
        })

    @property
    def connections(self) -> tuple[ConnectionInfo, ...]:
        """The connections in the order they were made (see
        :class:`ConnectionInfo`); after
        :meth:`finalize` each ``transform`` is the module in
        ``self.transforms[name]``."""
        built = [self.transforms[c.name] for c in self._connections] if self._finalized else self._pending_transforms
        return tuple(ConnectionInfo(name=c.name, src=c.src, dst=c.dst, delay=c.delay, transform=t)
                     for c, t in zip(self._connections, built))

    def _population(self, name: str) -> Population:
        return next(p for p in self._populations if p.name == name)

    def _read_inputs(self, x: Any) -> tuple[dict[str, jax.Array], int]:
        """``({input population: [B, size]}, B)``."""
        inputs = [p for p in self._populations if p.kind == _INPUT]
        if not inputs:
            leaves = jax.tree.leaves(x)
            if not leaves or jnp.ndim(leaves[0]) < 1:
                raise ValueError("PopulationGraph: the graph has no input population and reads only the batch "
                                 f"size from x, but x has no [B, ...] array leaf (got {type(x).__name__})")
            return {}, int(jnp.shape(leaves[0])[0])
        if isinstance(x, Mapping):
            wanted = {p.name: p.io_key or p.name for p in inputs}
            missing = sorted({k for k in wanted.values() if k not in x})
            if missing:
                raise ValueError(f"PopulationGraph: x is missing keys {missing}; input populations read "
                                 f"{wanted}, got keys {list(x)}")
            values = {name: x[key] for name, key in wanted.items()}
        elif len(inputs) != 1:
            raise ValueError(f"PopulationGraph: x is a {type(x).__name__} but the graph has {len(inputs)} input "
                             f"populations; pass a dict with keys {[p.io_key or p.name for p in inputs]}")
        else:
            values = {inputs[0].name: x}
        batch = None
        for p in inputs:
            shape = tuple(jnp.shape(values[p.name]))
            if len(shape) != 2 or shape[1] != p.size or (batch is not None and shape[0] != batch):
                expected = f"({'B' if batch is None else batch}, {p.size})"
                raise ValueError(f"PopulationGraph: input population {p.name!r} got x of shape {shape}, "
                                 f"expected {expected}")
            batch = shape[0]
        return values, batch

    def initialize_state(self, batch_size: int) -> Any:
        self._require_finalized("initialize_state()")
        buffers = {
            name: jnp.zeros((batch_size, depth, self._population(name).size), jnp.float32)
            for name, depth in self._buffers
        }
        carries = {c.name: self.transforms[c.name].initialize_state(batch_size) for c in self._connections}
        stateful = {name: carry for name, carry in carries.items() if jax.tree.leaves(carry)}
        return {"buffers": buffers, "transforms": stateful}

    def reset_state(self, prev_state: Any) -> Any:
        self._require_finalized("reset_state()")
        return {
            "buffers": jax.tree.map(jnp.zeros_like, prev_state["buffers"]),
            "transforms": {name: self.transforms[name].reset_state(carry)
                           for name, carry in prev_state["transforms"].items()},
        }

    def update_statistics(self, rollout_extras: Any) -> None:
        self._require_finalized("update_statistics()")
        for c in self._connections:
            self.transforms[c.name].update_statistics(child_extras(rollout_extras, c.name))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        """One step of every population in the fixed order (see the class
        docstring). Kept as one function because the step
        order, the delay buffers and the transforms' carries are read and
        written in one pass that is easiest to check top to bottom."""
        self._require_finalized("calling the graph")
        inputs, batch = self._read_inputs(x)
        depths = dict(self._buffers)
        buffers = state["buffers"]
        for name, depth in self._buffers:
            expected = (batch, depth, self._population(name).size)
            got = tuple(jnp.shape(buffers.get(name))) if name in buffers else None
            if got != expected:
                raise ValueError(f"PopulationGraph: delay buffer of population {name!r} has shape {got}, "
                                 f"expected {expected} (B, max_delay, size)")
        transform_state = state["transforms"]

        values: dict[str, jax.Array] = {}
        results = {}  # the connections' outputs, in the order they ran
        for name, incoming in self._incoming:
            pop = self._population(name)
            total = inputs.get(name)
            for c in incoming:
                if c.delay == 0:
                    src_value = values[c.src]
                else:
                    src_value = buffers[c.src][:, depths[c.src] - c.delay]
                out = self.transforms[c.name](transform_state.get(c.name, ()), src_value,
                                              child_extras(rollout_extras, c.name))
                y = out.output
                if not isinstance(y, jax.Array) or tuple(y.shape) != (batch, pop.size):
                    got = tuple(jnp.shape(y)) if isinstance(y, jax.Array) else type(y).__name__
                    raise ValueError(f"PopulationGraph: connection {c.name!r} produced output {got}, expected "
                                     f"({batch}, {pop.size}) (B, size of target population {name!r})")
                if c.name not in transform_state and jax.tree.leaves(out.next_state):
                    raise ValueError(f"PopulationGraph: transform of connection {c.name!r} returned a carry "
                                     "but its initialize_state() returned none")
                results[c.name] = out
                total = y if total is None else total + y
            if total is None:  # no input and no incoming connection
                total = jnp.zeros((batch, pop.size), jnp.float32)
            values[name] = total if pop.activation is None else pop.activation(total)

        next_buffers = {name: jnp.concatenate([buffers[name][:, 1:], values[name][:, None].astype(buffers[name].dtype)],
                                              axis=1) for name, _ in self._buffers}
        output = {p.io_key or p.name: values[p.name] for p in self._populations if p.kind == _OUTPUT}
        combined = combine_outputs(results, output)
        if self.record_activations:
            combined.metrics.update(activation_metrics(dict(values)))
        next_transforms = {name: carry for name, carry in combined.next_state.items() if name in transform_state}
        return combined.replace(next_state={"buffers": next_buffers, "transforms": next_transforms},
                                rollout_extras={c.name: combined.rollout_extras[c.name] for c in self._connections})
