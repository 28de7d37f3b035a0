"""The intention network: a variational encoder of the reference, a decoder of
``[latent, proprioception]``.

Motion-capture imitation (a virtual rodent tracking a reference clip) is
commonly trained with an *intention network*: an encoder reads a window of
future reference frames and produces a low-dimensional stochastic latent,
the "intention"; a decoder reads only that latent and the body's own
proprioception and produces the action distribution. The critic is an MLP
over the whole observation. :func:`make_intention_network` builds it from the
library's modules (no new module class), so the result can be inspected,
indexed and modified like any hand-built network, and it keeps the replay
guarantee: the latent is drawn by a
:class:`~nnx_ppo.networks.variational.VariationalBottleneck`, whose key per
env lives in the carry.

Two ready-made sizes, :data:`INTENTION_USERS_SIZE` (the published rodent
setups: 4 x 512 encoder and decoder, a 60-dim latent) and
:data:`INTENTION_CPU_SIZE` (small enough to train on a laptop CPU), are
dicts of keyword arguments: ``make_intention_network(env, rngs,
**INTENTION_USERS_SIZE)``.
"""

from __future__ import annotations

import math
import numbers
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from nnx_ppo.envs.spaces import is_space
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Sequential
from nnx_ppo.networks.factories import make_mlp_layers
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Filter, Flattener
from nnx_ppo.networks.variational import VariationalBottleneck

__all__ = [
    "INTENTION_USERS_SIZE",
    "INTENTION_CPU_SIZE",
    "make_intention_network",
    "make_users_intention_network",
    "count_parameters",
]

#: The size of the published rodent imitation setups: 4 x 512 encoder, a
#: 60-dim latent, 4 x 512 MLP decoder, 4 x 512 critic. With ``R`` reference
#: dims, ``P`` proprioception dims, ``A`` action dims and ``F`` observation
#: dims in all, the actor has ``512 (R + P) + 1026 A + 1,669,240`` parameters
#: and the critic ``512 F + 788,993`` (checked by the tests): for an
#: observation of R = 640 (5 future frames of 128 dims), P = 300 and A = 38
#: actions, 2,189,508 in the actor and 3,459,781 in all.
INTENTION_USERS_SIZE: Mapping[str, Any] = types.MappingProxyType({
    "encoder_sizes": (512, 512, 512, 512),
    "latent_size": 60,
    "decoder_sizes": (512, 512, 512, 512),
    "critic_sizes": (512, 512, 512, 512),
})

#: A size that trains in minutes on a CPU (and the defaults of
#: :func:`make_intention_network`): 2 x 64 encoder, a 16-dim latent, 2 x 64
#: decoder and critic. The actor has ``64 (R + P) + 130 A + 11,552``
#: parameters and the critic ``64 F + 4,289`` (MLP decoder).
INTENTION_CPU_SIZE: Mapping[str, Any] = types.MappingProxyType({
    "encoder_sizes": (64, 64),
    "latent_size": 16,
    "decoder_sizes": (64, 64),
    "critic_sizes": (64, 64),
})

_DECODERS = ("mlp", "lstm")


def count_parameters(module: nnx.Module) -> int:
    """Number of trainable parameters (``nnx.Param`` entries) of ``module``.

    Works on a module built for real and on one from ``nnx.eval_shape``
    (whose parameters are shapes only).
    """
    leaves = jax.tree.leaves(nnx.state(module, nnx.Param))
    return sum(math.prod(leaf.shape) for leaf in leaves)


def _is_shape(s: Any) -> bool:
    return isinstance(s, numbers.Integral) or (
        isinstance(s, tuple) and all(isinstance(d, numbers.Integral) for d in s))


def _width(shapes: Any) -> int:
    """Flat width of a pytree of shapes (ints or tuples of ints)."""
    leaves = jax.tree.leaves(shapes, is_leaf=_is_shape)
    if not leaves or not all(_is_shape(s) for s in leaves):
        raise ValueError(f"make_intention_network: expected shapes (ints or tuples of ints), got {shapes!r}")
    return sum(int(s) if isinstance(s, numbers.Integral) else math.prod(s) for s in leaves)


def _path(key: str | tuple) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _entry(observation_size: Mapping, key: str | tuple, role: str) -> Any:
    """The shapes of the observation entry at ``key`` (a key or a tuple path)."""
    value: Any = observation_size
    for part in _path(key):
        if not isinstance(value, Mapping) or part not in value:
            keys = list(observation_size)
            raise ValueError(f"make_intention_network: the observation has no {role} entry {key!r}; "
                             f"its keys are {keys} (pass {role}_key=...)")
        value = value[part]
    return value


def _observation_shapes(env: Any, observation_size: Any) -> Mapping:
    """The observation's shapes: from ``observation_size`` or ``env.observation_space``."""
    if observation_size is None:
        if env is None:
            raise TypeError("make_intention_network: pass an env or observation_size")
        from nnx_ppo.envs.spaces import space_shape

        observation_size = jax.tree.map(space_shape, env.observation_space, is_leaf=is_space)
    if not isinstance(observation_size, Mapping):
        raise TypeError(f"make_intention_network: the observation must be a dict holding the reference "
                        f"and the proprioception, got shapes {observation_size!r}")
    return observation_size


def _action_width(env: Any, action_size: int | None) -> int:
    """``A``: ``action_size``, or the flat size of the env's ``Box`` action space."""
    if action_size is None:
        if env is None:
            raise TypeError("make_intention_network: pass an env or action_size")
        from nnx_ppo.envs.spaces import Box

        space = env.action_space
        if not isinstance(space, Box):
            raise TypeError(f"make_intention_network: needs a continuous (Box) action space, got {space!r}")
        action_size = math.prod(space.shape)
    if isinstance(action_size, bool) or not isinstance(action_size, numbers.Integral) or action_size <= 0:
        raise ValueError(f"make_intention_network: action_size must be a positive int, got {action_size!r}")
    return int(action_size)


def make_intention_network(
    env: Any = None,
    rngs: nnx.Rngs | None = None,
    *,
    observation_size: Any = None,
    action_size: int | None = None,
    reference_key: str | tuple = "reference",
    proprioception_key: str | tuple = "proprioception",
    encoder_sizes: Sequence[int] = INTENTION_CPU_SIZE["encoder_sizes"],
    latent_size: int = INTENTION_CPU_SIZE["latent_size"],
    decoder_sizes: Sequence[int] = INTENTION_CPU_SIZE["decoder_sizes"],
    decoder: str = "mlp",
    critic_sizes: Sequence[int] = INTENTION_CPU_SIZE["critic_sizes"],
    kl_weight: float = 1e-3,
    entropy_weight: float = 1e-3,
    activation: str | Callable = "swish",
    normalize_obs: bool = True,
    min_std: float = 1e-2,
    std_scale: float = 1.0,
) -> Sequential:
    """An intention network actor-critic for dict observations ``{reference, proprioception, ...}``.

    For a batch of ``B`` envs, with ``R`` and ``P`` the flat widths of the
    reference and the proprioception entries (each an array or a dict of
    arrays, flattened), ``L = latent_size``, ``A`` the action dims and ``F``
    the flat width of the whole observation::

        Sequential([
            Normalizer(observation shapes),                       # if normalize_obs
            PPOAdapter(
                action=Sequential([
                    Filter({"intention": reference_key, "proprioception": proprioception_key}),
                    Concat(                                       # -> [B, L + P]: latent first
                        intention=Sequential([Flattener(),        # [B, R]
                                              MLP(encoder_sizes), Dense(2 L),
                                              VariationalBottleneck(L, kl_weight)]),   # z: [B, L]
                        proprioception=Flattener(),               # [B, P]
                    ),
                    MLP(decoder_sizes) | LSTM(decoder_sizes[0]) -> LSTM(decoder_sizes[1]) -> ...,
                    Dense(2 A), NormalTanhSampler,                # actions [B, A], loglikelihoods [B]
                ]),
                value=Sequential([Flattener(), MLP(critic_sizes), Dense(1)]),  # [B, F] -> values [B]
            ),
        ])

    The decoder sees only ``[z, proprioception]``: the reference reaches the
    action through the latent alone. The latent is ``z = mean + std * eps``
    with ``eps`` drawn from a key per env kept in the carry (the randomness
    rule), so the loss replay reproduces every rollout sample, however the
    envs are split into minibatches. Its KL to ``N(0, I)`` (summed over the
    ``L`` dims, averaged over the batch) enters the loss as
    ``kl_weight * KL`` and is logged as the metric
    ``network/1/action/1/intention/<n + 2>/kl_divergence`` for ``n`` encoder
    layers (``network/0/...`` without the normalizer). Observation entries other than
    the reference and the proprioception are read by the critic only.

    Usable from the command line as ``--network
    nnx_ppo.networks.intention:make_intention_network`` (the defaults: the
    CPU size); for the users' size, write a function of your own that calls
    this one with ``**INTENTION_USERS_SIZE``.

    Args:
      env: an env whose ``observation_space`` is a dict holding the reference
        and the proprioception and whose ``action_space`` is a ``Box``; not
        needed when ``observation_size`` and ``action_size`` are given.
      rngs: parameter and sampling RNGs (default ``nnx.Rngs(0)``); the
        bottleneck seeds its per-env keys from it.
      observation_size: the observation's shapes instead of ``env``'s: a dict
        (possibly nested) of ints or shape tuples, with the structure of the
        observation, e.g. ``{"reference": (5, 40), "proprioception": 60}``.
      action_size: ``A`` instead of the env's action space.
      reference_key: the observation entry the encoder reads (a key, or a
        tuple path into nested dicts).
      proprioception_key: the entry the decoder reads besides the latent.
      encoder_sizes: hidden widths of the encoder MLP (may be empty).
      latent_size: ``L``, the dims of the intention.
      decoder_sizes: hidden widths of the decoder: of its MLP layers
        (``decoder="mlp"``, may be empty) or of its stacked LSTMs
        (``decoder="lstm"``, at least one).
      decoder: ``"mlp"`` or ``"lstm"``.
      critic_sizes: hidden widths of the critic MLP (may be empty).
      kl_weight: weight of the latent's KL in the loss.
      entropy_weight: weight of the action sampler's entropy bonus.
      activation: name (``relu``, ``tanh``, ``elu``, ``swish``, ``gelu``) or
        callable, after every hidden Dense layer.
      normalize_obs: start with a running-statistics :class:`Normalizer`.
      min_std: floor of the action distribution's std.
      std_scale: multiplies the action distribution's std.

    Returns:
      The actor-critic, a :class:`~nnx_ppo.networks.containers.Sequential`
      whose output is a :class:`~nnx_ppo.networks.types.PPONetworkOutput`
      (``actions`` ``[B, A]``, ``loglikelihoods`` ``[B]``,
      ``value_estimates`` ``[B]``).

    Raises:
      TypeError: neither an env nor the sizes; a non-dict observation; a
        non-``Box`` action space.
      ValueError: a missing observation entry, an unknown ``decoder`` or
        activation, an LSTM decoder without sizes, a non-positive size.
    """
    if decoder not in _DECODERS:
        raise ValueError(f"make_intention_network: decoder must be 'mlp' or 'lstm', got {decoder!r}")
    if decoder == "lstm" and not decoder_sizes:
        raise ValueError("make_intention_network: an LSTM decoder needs at least one size in decoder_sizes")
    if isinstance(latent_size, bool) or not isinstance(latent_size, numbers.Integral) or latent_size <= 0:
        raise ValueError(f"make_intention_network: latent_size must be a positive int, got {latent_size!r}")
    for name, sizes in (("encoder_sizes", encoder_sizes), ("decoder_sizes", decoder_sizes),
                        ("critic_sizes", critic_sizes)):
        if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s <= 0 for s in sizes):
            raise ValueError(f"make_intention_network: {name} must be positive ints, got {tuple(sizes)!r}")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    shapes = _observation_shapes(env, observation_size)
    n_reference = _width(_entry(shapes, reference_key, "reference"))
    n_proprioception = _width(_entry(shapes, proprioception_key, "proprioception"))
    n_observation = _width(shapes)
    n_action = _action_width(env, action_size)
    latent = int(latent_size)

    # Built in the order encoder, decoder, action head, critic (the RNG order).
    encoder_mlp = make_mlp_layers([n_reference, *encoder_sizes], rngs, activation) if encoder_sizes else []
    encoder = Sequential([
        Flattener(),
        *encoder_mlp,
        Dense(encoder_sizes[-1] if encoder_sizes else n_reference, 2 * latent, rngs),
        VariationalBottleneck(latent, rngs, kl_weight),
    ])
    decoder_in = latent + n_proprioception
    if decoder == "mlp":
        decoder_layers: list[StatefulModule] = (
            make_mlp_layers([decoder_in, *decoder_sizes], rngs, activation) if decoder_sizes else [])
    else:
        widths = [decoder_in, *decoder_sizes]
        decoder_layers = [LSTM(n_in, n_out, rngs) for n_in, n_out in zip(widths[:-1], widths[1:])]
    head_in = decoder_sizes[-1] if decoder_sizes else decoder_in
    action = Sequential([
        Filter({"intention": reference_key, "proprioception": proprioception_key}),
        Concat(intention=encoder, proprioception=Flattener()),
        *decoder_layers,
        Dense(head_in, 2 * n_action, rngs, init_scale=0.01),
        NormalTanhSampler(rngs, entropy_weight=entropy_weight, min_std=min_std, std_scale=std_scale),
    ])
    critic_mlp = make_mlp_layers([n_observation, *critic_sizes], rngs, activation) if critic_sizes else []
    value = Sequential([
        Flattener(),
        *critic_mlp,
        Dense(critic_sizes[-1] if critic_sizes else n_observation, 1, rngs),
    ])
    front: list[StatefulModule] = [Normalizer(shapes)] if normalize_obs else []
    return Sequential([*front, PPOAdapter(action=action, value=value)])


def make_users_intention_network(env: Any = None, rngs: nnx.Rngs | None = None, **kwargs: Any) -> Sequential:
    """:func:`make_intention_network` at the users' size
    (:data:`INTENTION_USERS_SIZE`, about 3.5M parameters for the rodent);
    ``kwargs`` are its other arguments and may override the sizes. On the
    command line: ``--network
    nnx_ppo.networks.intention:make_users_intention_network``."""
    return make_intention_network(env, rngs, **{**INTENTION_USERS_SIZE, **kwargs})
