"""How to rebuild a trained network: one spec, written with the run and the checkpoints.

A :class:`NetworkSpec` names the env and the factory network
(:func:`~nnx_ppo.networks.factories.make_actor_critic_for_env`) with its
sizes and seed. The CLI writes ``spec.to_dict()`` into the run's
``config.json`` and into every checkpoint's metadata (``metadata["network"]``);
:func:`load_network` reads it back to rebuild the network before loading
its variables. Checkpointing itself only reads and writes state.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

__all__ = ["NetworkSpec", "network_kwargs", "load_network", "FACTORY_KINDS", "is_factory_reference",
           "resolve_factory_reference", "check_network_function_result", "NetworkFunctionError"]

FACTORY_KINDS = ("mlp", "lstm", "gru")
"""The networks :func:`~nnx_ppo.networks.factories.make_actor_critic_for_env` builds."""


def network_kwargs(network: str, hidden_size: int) -> dict[str, Any]:
    """Factory sizes for a network kind and width: an MLP gets two hidden
    layers each for actor and critic; LSTM/GRU one encoder layer and the core.
    A network of the user's own (a reference) gets none."""
    if is_factory_reference(network):
        return {}
    if network == "mlp":
        return {"actor_hidden_sizes": [hidden_size, hidden_size], "critic_hidden_sizes": [hidden_size, hidden_size]}
    return {"hidden_size": hidden_size, "encoder_sizes": [hidden_size]}


def is_factory_reference(kind: str) -> bool:
    """Whether ``kind`` names a user's network function, ``MODULE:FUNCTION``
    or ``FILE.py:FUNCTION``, rather than one of :data:`FACTORY_KINDS`."""
    return isinstance(kind, str) and ":" in kind


def resolve_factory_reference(ref: str):
    """The function ``ref`` names: ``package.module:function`` (importable, or
    found from the current directory) or ``path/to/file.py:function`` (see
    :func:`nnx_ppo.envs.registry.load`). It is called as ``function(env, rngs)``
    and returns the network. A ValueError says in one line what could not be found."""
    from nnx_ppo.envs.registry import load

    function = load(ref, "network", "function")
    if not callable(function):
        raise ValueError(f"network {ref!r}: {ref.rpartition(':')[0]} has no function {ref.rpartition(':')[2]!r}")
    return function


class NetworkFunctionError(TypeError):
    """A network function (``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``)
    returned something that is not an nnx_ppo network; the message, one
    line, names the function and what it returned."""


_NETWORK_CONTRACT = ("a network function must return an nnx_ppo network (a StatefulModule ending in a PPOAdapter, "
                     "see docs/own_network.md)")
_MODULE_METHODS = ("initialize_state", "reset_state", "__call__")


def _kind_of(value: Any) -> str:
    """``value``'s type with an article, for a message: "a dict", "an Array"."""
    name = type(value).__qualname__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _output_kind(output: Any) -> str:
    """What a network's step output is, for a message: "a float32[1, 2] array", "a dict"."""
    shape, dtype = getattr(output, "shape", None), getattr(output, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a {dtype}[{', '.join(str(d) for d in shape)}] array"
    return _kind_of(output)


def _one_step_output(network: Any, env: Any) -> Any:
    """What one step of ``network`` outputs on a batch of one of ``env``'s
    observations, as shapes only (nothing is computed; the network is left
    as it is)."""
    import jax

    from nnx_ppo.algorithms.functional import NetworkFn

    obs = jax.eval_shape(lambda key: jax.vmap(env.reset)(jax.random.split(key, 1)).obs, jax.random.key(0))

    def forward(view, obs):
        carry, view = view.initialize(1)
        out, _ = view.apply(carry, obs)
        return out

    out = jax.eval_shape(forward, NetworkFn.of(network), obs)
    return getattr(out, "output", out)


def check_network_function_result(network: Any, env: Any, ref: str) -> Any:
    """``network``, what the network function ``ref`` returned for ``env``,
    once it is known to be an nnx_ppo network: an ``nnx.Module`` with the
    module contract (``initialize_state``, ``reset_state``, ``__call__``)
    whose step outputs a :class:`~nnx_ppo.networks.types.PPONetworkOutput`
    (checked on shapes only). Otherwise a :class:`NetworkFunctionError`
    names ``ref`` and what it returned."""
    from flax import nnx

    from nnx_ppo.networks.types import PPONetworkOutput

    if not isinstance(network, nnx.Module):
        raise NetworkFunctionError(f"{ref} returned {_kind_of(network)}; {_NETWORK_CONTRACT}")
    missing = [m for m in _MODULE_METHODS if not callable(getattr(network, m, None))]
    if missing:
        raise NetworkFunctionError(f"{ref} returned {_kind_of(network)}, which has no {' or '.join(missing)}; "
                                   f"{_NETWORK_CONTRACT}")
    output = _one_step_output(network, env)
    if not isinstance(output, PPONetworkOutput):
        raise NetworkFunctionError(f"{ref} returned {_kind_of(network)} whose output is {_output_kind(output)}, not a "
                                   f"PPONetworkOutput; {_NETWORK_CONTRACT}")
    return network


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
    """A factory actor-critic for an env, rebuildable from JSON.

    Attributes:
      env: env spec for :func:`nnx_ppo.envs.make`.
      kind: ``"mlp"``, ``"lstm"`` or ``"gru"``, or the user's own network
        function as ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION`` (see
        :func:`resolve_factory_reference`), called as ``function(env, rngs)``.
      kwargs: keyword arguments of ``make_actor_critic_for_env`` (sizes).
      seed: the ``nnx.Rngs`` seed of the initial parameters.
      env_kwargs: keyword arguments for ``make``.
      hidden_size: the width ``kwargs`` were derived from (``--hidden-size``), if any.
    """

    env: str
    kind: str = "mlp"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    hidden_size: int | None = None

    @classmethod
    def sized(cls, env: str, kind: str, hidden_size: int, seed: int = 0,
              env_kwargs: dict[str, Any] | None = None) -> "NetworkSpec":
        """The spec of a ``kind`` network of width ``hidden_size`` (see :func:`network_kwargs`)."""
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"NetworkSpec: hidden_size must be a positive integer, got {hidden_size!r}")
        if is_factory_reference(kind):
            from nnx_ppo.envs.registry import normalized

            kind = normalized(kind)
        elif kind not in FACTORY_KINDS:
            raise ValueError(f"network must be one of {', '.join(FACTORY_KINDS)}, or your own network function as "
                             f"MODULE:FUNCTION or FILE.py:FUNCTION, got {kind!r}")
        return cls(env=env, kind=kind, kwargs=network_kwargs(kind, hidden_size), seed=seed,
                   env_kwargs=dict(env_kwargs or {}), hidden_size=hidden_size)

    def make_env(self):
        """The env the network was built for."""
        from nnx_ppo.envs.registry import make

        return make(self.env, **self.env_kwargs)

    def build(self, env=None, rngs=None):
        """The network, freshly initialized from ``seed`` (or from ``rngs``),
        for ``env`` (or :meth:`make_env` when not given). A network function
        of the user's that returns no nnx_ppo network is a
        :class:`NetworkFunctionError` (see :func:`check_network_function_result`)."""
        from flax import nnx

        from nnx_ppo.networks.factories import make_actor_critic_for_env

        env = self.make_env() if env is None else env
        rngs = nnx.Rngs(int(self.seed)) if rngs is None else rngs
        if is_factory_reference(self.kind):
            network = resolve_factory_reference(self.kind)(env, rngs, **self.kwargs)
            return check_network_function_result(network, env, self.kind)
        return make_actor_critic_for_env(env, self.kind, rngs, **self.kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (what :meth:`from_dict` reads)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "network spec") -> "NetworkSpec":
        """Rebuild from :meth:`to_dict`'s form; a ValueError names ``where``
        when ``data`` does not describe a network."""
        if not isinstance(data, dict) or not isinstance(data.get("env"), str):
            raise ValueError(f"{where} does not describe how to rebuild the network (expected a dict "
                             f"with 'env', 'kind', 'kwargs', 'seed'), got {data!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def load_network(directory: str | os.PathLike, network: Any = None, seed: int | None = None,
                 step: int | str | None = None, *, member: int | None = None):
    """Load a trained network for inference from ``directory`` (a run
    directory of ``nnx-ppo train``, its checkpoint directory, or one
    checkpoint in it).

    ``step`` picks the checkpoint: the latest (None), the best evaluated
    policy (``"best"``, kept by training with evaluation and checkpoints), or
    the one saved at env step N. Without ``network``, the network is rebuilt
    from the checkpoint's ``metadata["network"]`` (a :class:`NetworkSpec`,
    written by ``nnx-ppo train``); with it, its variables are replaced (same
    architecture). Returns the network in deterministic mode. For a run of
    several seeds trained together, ``seed`` picks one; for a population
    (:func:`~nnx_ppo.algorithms.population.train_population`, ``nnx-ppo
    sweep``), ``member`` (its index, ``0 .. N-1``). See
    :func:`nnx_ppo.algorithms.checkpointing.restore_network` for the errors.
    """
    import nnx_ppo.algorithms.checkpointing as checkpointing

    if member is not None:
        if seed is not None:
            raise ValueError(f"load_network: give seed= (a seed batch) or member= (a population), not both "
                             f"(got seed={seed}, member={member})")
        latest = checkpointing.find_checkpoint(directory, None, None)
        if "members" not in (checkpointing.load_metadata(latest) or {}):
            raise ValueError(f"{os.fspath(directory)!r} is not a population (nnx-ppo sweep, train_population); "
                             "load a seed of a seed batch with seed=")
        seed = member  # a population's members are its batch entries 0 .. N-1

    path = checkpointing.find_checkpoint(directory, step, seed if step == "best" else None)
    if network is None:
        metadata = checkpointing.load_metadata(path)
        spec = metadata.get("network") if isinstance(metadata, dict) else None
        try:
            network = NetworkSpec.from_dict(spec, where=f"the metadata of checkpoint {os.fspath(path)!r}")
        except ValueError as err:
            raise ValueError(f"{err}; build the network yourself and pass it as "
                             "load_network(directory, network=...)") from None
        network = network.build()
    # A best policy is one seed's alone, even in a run of several seeds. The
    # latest: the newest intact checkpoint of its directory (a truncated one is skipped).
    named = step is not None or path == pathlib.Path(directory).absolute()  # one checkpoint asked for
    source = path if named else path.parent
    return checkpointing.restore_network(source, network, seed=None if step == "best" else seed)
