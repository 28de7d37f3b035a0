"""Ready-made networks: MLPs and actor-critics, feed-forward or recurrent.

Every factory returns an ordinary composition of library modules, so the
result can be inspected, indexed and modified like a hand-built network.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

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
    "ActorCriticOptions",
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
    """Dense layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` (``len(sizes) - 1`` layers).

    Args:
      sizes: input size, hidden widths and output size (at least two entries).
      rngs: parameter RNGs.
      activation: name (``relu``, ``tanh``, ``elu``, ``swish``, ``gelu``) or
        callable, after every layer (see ``activation_last_layer``).
      activation_last_layer: apply ``activation`` after the last layer too.
      last_layer_init_scale: scale of the last layer's initial weights.
    """
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


def make_mlp(sizes: Sequence[int], rngs: nnx.Rngs, *args: Any, **kwargs: Any) -> Sequential:
    """An MLP as a :class:`Sequential` of :class:`Dense` layers.

    ``make_mlp(sizes, rngs, activation="relu", activation_last_layer=True,
    last_layer_init_scale=1.0)``: the arguments, positional or keyword, are
    those of :func:`make_mlp_layers`, which builds the layers.

    Args:
      sizes: input size, hidden widths and output size (at least two entries).
      rngs: parameter RNGs.
      *args: ``activation``, ``activation_last_layer``, ``last_layer_init_scale``
        given by position.
      **kwargs: the same given by keyword.
    """
    return Sequential(make_mlp_layers(sizes, rngs, *args, **kwargs))


def _obs_front(obs_size: Any, normalize_obs: bool) -> tuple[list[StatefulModule], int]:
    """Normalizer (optional) and Flattener for an int, tuple or dict of shapes."""
    if isinstance(obs_size, int):
        flat = obs_size
    else:
        shapes = jax.tree.leaves(
            obs_size, is_leaf=lambda s: isinstance(s, tuple) and all(isinstance(d, int) for d in s)
        )
        flat = sum(math.prod(s) if isinstance(s, tuple) else int(s) for s in shapes)
    layers: list[StatefulModule] = [Normalizer(obs_size)] if normalize_obs else []
    if not isinstance(obs_size, int):
        layers.append(Flattener())
    return layers, flat


class ActorCriticOptions(TypedDict, total=False):
    """Keyword options shared by :func:`make_mlp_actor_critic` and
    :func:`make_recurrent_actor_critic` (and so by :func:`make_actor_critic_for_env`).

    Every key is optional; a missing key takes the default in brackets.

    Attributes:
      activation: name (``relu``, ``tanh``, ``elu``, ``swish``, ``gelu``) or
        callable (``"swish"``).
      normalize_obs: start with a running-statistics :class:`Normalizer` (``True``).
      discrete: categorical head (``action_size`` actions) instead of
        tanh-Gaussian (``False``).
      entropy_weight: weight of the entropy bonus (``1e-3``).
      min_std: floor of the Gaussian std (``1e-2``).
      std_scale: multiplies the Gaussian std (``1.0``).
      value_keys: one value head per reward key, for dict rewards (``None``:
        a single value head).
    """

    activation: str | Callable
    normalize_obs: bool
    discrete: bool
    entropy_weight: float
    min_std: float
    std_scale: float
    value_keys: Sequence[str] | None


_DEFAULT_OPTIONS: ActorCriticOptions = {
    "activation": "swish",
    "normalize_obs": True,
    "discrete": False,
    "entropy_weight": 1e-3,
    "min_std": 1e-2,
    "std_scale": 1.0,
    "value_keys": None,
}


def _prepare(
    factory: str, obs_size: Any, rngs: nnx.Rngs | None, options: dict[str, Any], own: Sequence[str] = ()
) -> tuple[ActorCriticOptions, nnx.Rngs, list[StatefulModule], int]:
    """What both actor-critic factories start from.

    Returns ``(options, rngs, front, flat)``: the options completed with their
    defaults, ``rngs`` (``nnx.Rngs(0)`` when ``None``), the observation front
    layers and the flat observation size (see :func:`_obs_front`). Raises a
    ``TypeError`` naming ``factory`` for an option it does not know, listing
    every keyword it takes: ``own`` (its own sizes and settings) and the shared options.
    """
    unknown = sorted(set(options) - set(_DEFAULT_OPTIONS))
    if unknown:
        import difflib

        valid = sorted({*own, *_DEFAULT_OPTIONS})
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        raise TypeError(
            f"{factory}() got an unexpected keyword argument {unknown[0]!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; its keyword arguments are {', '.join(valid)} (see its docstring and ActorCriticOptions)"
        )
    resolved: ActorCriticOptions = {**_DEFAULT_OPTIONS, **options}
    front, flat = _obs_front(obs_size, resolved["normalize_obs"])
    return resolved, rngs if rngs is not None else nnx.Rngs(0), front, flat


def _heads(
    options: ActorCriticOptions, action_size: int, policy_in: int, value_in: int, rngs: nnx.Rngs
) -> tuple[list[StatefulModule], StatefulModule]:
    """``(policy layers, value head)``, built in that order (the RNG order).

    The policy is a ``Dense`` producing logits (``discrete``) or mean and std
    (``2 * action_size``), then its sampler; the value head is one ``Dense``,
    or a :class:`Parallel` of them keyed by ``value_keys``.
    """
    if isinstance(action_size, bool) or not isinstance(action_size, numbers.Integral):
        raise TypeError(f"action_size must be an int (the number of action dims, or of discrete actions), got "
                        f"{action_size!r}; for a tuple or dict of actions, build the policy head by hand: a "
                        "PPOAdapter whose action port ends in one sampler per action (docs/networks.md)")
    if options["discrete"]:
        policy: list[StatefulModule] = [
            Dense(policy_in, action_size, rngs, init_scale=0.01),
            CategoricalSampler(rngs, entropy_weight=options["entropy_weight"]),
        ]
    else:
        policy = [
            Dense(policy_in, 2 * action_size, rngs, init_scale=0.01),
            NormalTanhSampler(rngs, entropy_weight=options["entropy_weight"], min_std=options["min_std"],
                              std_scale=options["std_scale"]),
        ]
    value_keys = options["value_keys"]
    if value_keys is None:
        return policy, Dense(value_in, 1, rngs)
    return policy, Parallel({k: Dense(value_in, 1, rngs) for k in value_keys})


def make_mlp_actor_critic(
    obs_size: Any,
    action_size: int,
    actor_hidden_sizes: Sequence[int] = (64, 64),
    critic_hidden_sizes: Sequence[int] = (64, 64),
    rngs: nnx.Rngs | None = None,
    **options: Unpack[ActorCriticOptions],
) -> Sequential:
    """Feed-forward actor-critic with separate actor and critic MLPs.

    Args:
      obs_size: observation size: an int, a shape tuple, or a dict of them.
      action_size: number of continuous action dims, or of discrete actions.
      actor_hidden_sizes: hidden widths of the actor MLP.
      critic_hidden_sizes: hidden widths of the critic MLP.
      rngs: parameter and sampling RNGs (default ``nnx.Rngs(0)``).
      **options: keyword-only options of :class:`ActorCriticOptions`
        (``activation``, ``normalize_obs``, ``discrete``, ``entropy_weight``,
        ``min_std``, ``std_scale``, ``value_keys``).

    Returns ``Sequential([Normalizer?, Flattener?, PPOAdapter(action=..., value=...)])``.
    """
    options, rngs, front, flat = _prepare("make_mlp_actor_critic", obs_size, rngs, options,
                                          own=("actor_hidden_sizes", "critic_hidden_sizes"))
    activation = options["activation"]
    actor = make_mlp([flat, *actor_hidden_sizes], rngs, activation) if actor_hidden_sizes else None
    critic = make_mlp([flat, *critic_hidden_sizes], rngs, activation) if critic_hidden_sizes else None
    a_out = actor_hidden_sizes[-1] if actor_hidden_sizes else flat
    c_out = critic_hidden_sizes[-1] if critic_hidden_sizes else flat
    policy, value_head = _heads(options, action_size, a_out, c_out, rngs)
    action = Sequential([*([actor] if actor else []), *policy])
    value = Sequential([*([critic] if critic else []), value_head])
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
    forget_bias: float = 1.0,
    update_bias: float = 0.0,
    **options: Unpack[ActorCriticOptions],
) -> Sequential:
    """Recurrent actor-critic: ``encoder MLP -> LSTM|GRU core -> heads``.

    Args:
      obs_size: observation size: an int, a shape tuple, or a dict of them.
      action_size: number of continuous action dims, or of discrete actions.
      rngs: parameter and sampling RNGs (default ``nnx.Rngs(0)``).
      core: ``"lstm"`` or ``"gru"``.
      hidden_size: width of the recurrent core.
      encoder_sizes: hidden widths of the encoder MLP before the core (may be empty).
      shared_trunk: actor and critic share one encoder and core; otherwise
        each has its own (the default).
      forget_bias: the LSTM's initial forget-gate bias (see
        :class:`~nnx_ppo.networks.recurrent.LSTM`); an LSTM only.
      update_bias: the GRU's initial update-gate bias (see
        :class:`~nnx_ppo.networks.recurrent.GRU`); a GRU only.
      **options: keyword-only options of :class:`ActorCriticOptions`, as in
        :func:`make_mlp_actor_critic`.
    """
    if core not in ("lstm", "gru"):
        raise ValueError(f"make_recurrent_actor_critic: core must be 'lstm' or 'gru', got {core!r}")
    own = ("hidden_size", "encoder_sizes", "shared_trunk", "forget_bias" if core == "lstm" else "update_bias")
    options, rngs, front, flat = _prepare("make_recurrent_actor_critic", obs_size, rngs, options, own=own)
    if core == "gru" and forget_bias != 1.0:
        raise ValueError(f"make_recurrent_actor_critic: forget_bias is an LSTM's; the GRU core has none "
                         f"(got forget_bias={forget_bias}; a GRU's is update_bias)")
    if core == "lstm" and update_bias != 0.0:
        raise ValueError(f"make_recurrent_actor_critic: update_bias is a GRU's; the LSTM core has none "
                         f"(got update_bias={update_bias}; an LSTM's is forget_bias)")
    cell = (functools.partial(LSTM, forget_bias=forget_bias) if core == "lstm"
            else functools.partial(GRU, update_bias=update_bias))

    def trunk():
        encoder = make_mlp_layers([flat, *encoder_sizes], rngs, options["activation"]) if encoder_sizes else []
        core_in = encoder_sizes[-1] if encoder_sizes else flat
        return [*encoder, cell(core_in, hidden_size, rngs)]

    policy, value = _heads(options, action_size, hidden_size, hidden_size, rngs)
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
