"""Ready-made networks: MLPs and actor-critics, feed-forward or recurrent.

Every factory returns an ordinary composition of library modules, so the
result can be inspected, indexed and modified like a hand-built network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import math

import jax
from flax import nnx

from nnx_ppo.envs.spaces import is_space
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Parallel, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Flattener

__all__ = [
    "make_mlp_layers",
    "make_mlp",
    "make_mlp_actor_critic",
    "make_recurrent_actor_critic",
    "make_actor_critic_for_env",
]

_ACTIVATIONS = {"relu": nnx.relu, "tanh": nnx.tanh, "elu": nnx.elu, "swish": nnx.swish, "gelu": nnx.gelu}


def _activation(activation: str | Callable) -> Callable:
    if callable(activation):
        return activation
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[activation]


def make_mlp_layers(
    sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: str | Callable = "relu",
    activation_last_layer: bool = True,
    last_layer_init_scale: float = 1.0,
) -> list[Dense]:
    """Dense layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` (``len(sizes) - 1`` layers)."""
    if len(sizes) < 2:
        raise ValueError(f"make_mlp: sizes needs an input and an output size, got {list(sizes)}")
    act = _activation(activation)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        layers.append(
            Dense(
                n_in,
                n_out,
                rngs,
                activation=act if (not last or activation_last_layer) else None,
                init_scale=last_layer_init_scale if last else 1.0,
            )
        )
    return layers


def make_mlp(
    sizes: Sequence[int],
    rngs: nnx.Rngs,
    activation: str | Callable = "relu",
    activation_last_layer: bool = True,
    last_layer_init_scale: float = 1.0,
) -> Sequential:
    """An MLP as a :class:`Sequential` of :class:`Dense` layers."""
    return Sequential(make_mlp_layers(sizes, rngs, activation, activation_last_layer, last_layer_init_scale))


def _obs_front(obs_size: Any, normalize_obs: bool) -> tuple[list[StatefulModule], int]:
    """Normalizer (optional) and Flattener for an int, tuple or dict of shapes."""
    if isinstance(obs_size, int):
        flat = obs_size
    else:
        shapes = jax.tree.leaves(obs_size, is_leaf=lambda s: isinstance(s, tuple) and all(isinstance(d, int) for d in s))
        flat = sum(math.prod(s) if isinstance(s, tuple) else int(s) for s in shapes)
    layers: list[StatefulModule] = [Normalizer(obs_size)] if normalize_obs else []
    if not isinstance(obs_size, int):
        layers.append(Flattener())
    return layers, flat


def _policy_head(in_size, action_size, discrete, rngs, entropy_weight, min_std, std_scale=1.0) -> list[StatefulModule]:
    if discrete:
        return [Dense(in_size, action_size, rngs, init_scale=0.01), CategoricalSampler(rngs, entropy_weight=entropy_weight)]
    return [
        Dense(in_size, 2 * action_size, rngs, init_scale=0.01),
        NormalTanhSampler(rngs, entropy_weight=entropy_weight, min_std=min_std, std_scale=std_scale),
    ]


def _value_head(in_size, rngs, value_keys) -> StatefulModule:
    if value_keys is None:
        return Dense(in_size, 1, rngs)
    return Parallel({k: Dense(in_size, 1, rngs) for k in value_keys})


def make_mlp_actor_critic(
    obs_size: Any,
    action_size: int,
    actor_hidden_sizes: Sequence[int] = (64, 64),
    critic_hidden_sizes: Sequence[int] = (64, 64),
    rngs: nnx.Rngs | None = None,
    *,
    activation: str | Callable = "swish",
    normalize_obs: bool = True,
    discrete: bool = False,
    entropy_weight: float = 1e-3,
    min_std: float = 1e-2,
    std_scale: float = 1.0,
    value_keys: Sequence[str] | None = None,
) -> Sequential:
    """Feed-forward actor-critic with separate actor and critic MLPs.

    Args:
      obs_size: observation size: an int, a shape tuple, or a dict of them.
      action_size: number of continuous action dims, or of discrete actions.
      actor_hidden_sizes: hidden widths of the actor MLP.
      critic_hidden_sizes: hidden widths of the critic MLP.
      rngs: parameter and sampling RNGs (default ``nnx.Rngs(0)``).
      activation: name (``relu``, ``tanh``, ``elu``, ``swish``, ``gelu``) or callable.
      normalize_obs: start with a running-statistics :class:`Normalizer`.
      discrete: categorical head (``action_size`` actions) instead of tanh-Gaussian.
      entropy_weight: weight of the entropy bonus.
      min_std: floor of the Gaussian std.
      std_scale: multiplies the Gaussian std.
      value_keys: one value head per reward key, for dict rewards.

    Returns ``Sequential([Normalizer?, Flattener?, PPOAdapter(action=..., value=...)])``.
    """
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    front, flat = _obs_front(obs_size, normalize_obs)
    actor = make_mlp([flat, *actor_hidden_sizes], rngs, activation) if actor_hidden_sizes else None
    critic = make_mlp([flat, *critic_hidden_sizes], rngs, activation) if critic_hidden_sizes else None
    a_out = actor_hidden_sizes[-1] if actor_hidden_sizes else flat
    c_out = critic_hidden_sizes[-1] if critic_hidden_sizes else flat
    action = Sequential([*([actor] if actor else []), *_policy_head(a_out, action_size, discrete, rngs, entropy_weight, min_std, std_scale)])
    value = Sequential([*([critic] if critic else []), _value_head(c_out, rngs, value_keys)])
    return Sequential([*front, PPOAdapter(action=action, value=value)])


def make_recurrent_actor_critic(
    obs_size: Any,
    action_size: int,
    rngs: nnx.Rngs | None = None,
    *,
    core: str = "lstm",
    hidden_size: int = 64,
    encoder_sizes: Sequence[int] = (64,),
    shared_trunk: bool = False,
    activation: str | Callable = "swish",
    normalize_obs: bool = True,
    discrete: bool = False,
    entropy_weight: float = 1e-3,
    min_std: float = 1e-2,
    std_scale: float = 1.0,
    value_keys: Sequence[str] | None = None,
) -> Sequential:
    """Recurrent actor-critic: ``encoder MLP -> LSTM|GRU core -> heads``.

    With ``shared_trunk=True`` actor and critic share one encoder and core;
    otherwise each has its own (the default). Other arguments as in
    :func:`make_mlp_actor_critic`; ``core`` is ``"lstm"`` or ``"gru"``.
    """
    if core not in ("lstm", "gru"):
        raise ValueError(f"make_recurrent_actor_critic: core must be 'lstm' or 'gru', got {core!r}")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    front, flat = _obs_front(obs_size, normalize_obs)
    cell = LSTM if core == "lstm" else GRU

    def trunk():
        encoder = make_mlp_layers([flat, *encoder_sizes], rngs, activation) if encoder_sizes else []
        core_in = encoder_sizes[-1] if encoder_sizes else flat
        return [*encoder, cell(core_in, hidden_size, rngs)]

    policy = _policy_head(hidden_size, action_size, discrete, rngs, entropy_weight, min_std, std_scale)
    value = _value_head(hidden_size, rngs, value_keys)
    if shared_trunk:
        return Sequential([*front, *trunk(), PPOAdapter(action=Sequential(policy), value=value)])
    return Sequential(
        [*front, PPOAdapter(action=Sequential([*trunk(), *policy]), value=Sequential([*trunk(), value]))]
    )


def make_actor_critic_for_env(env: Any, network: str = "mlp", rngs: nnx.Rngs | None = None, **kwargs) -> Sequential:
    """Build an actor-critic whose input and head match ``env``'s spaces.

    ``network`` is ``"mlp"``, ``"lstm"`` or ``"gru"``; other keyword arguments
    go to the factory. The env must expose ``observation_space`` and
    ``action_space`` (see :mod:`nnx_ppo.envs`).
    """
    from nnx_ppo.envs.spaces import Discrete, space_shape

    obs_size = jax.tree.map(lambda s: space_shape(s), env.observation_space, is_leaf=is_space)
    if isinstance(obs_size, tuple) and len(obs_size) == 1:
        obs_size = obs_size[0]
    space = env.action_space
    discrete = isinstance(space, Discrete)
    action_size = space.n if discrete else math.prod(space_shape(space))
    if network == "mlp":
        return make_mlp_actor_critic(obs_size, action_size, rngs=rngs, discrete=discrete, **kwargs)
    if network in ("lstm", "gru"):
        return make_recurrent_actor_critic(obs_size, action_size, rngs, core=network, discrete=discrete, **kwargs)
    raise ValueError(f"make_actor_critic_for_env: network must be 'mlp', 'lstm' or 'gru', got {network!r}")
