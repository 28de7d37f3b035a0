"""Ready-made networks: MLPs and actor-critics (feed-forward or recurrent),
an actor-critic for a body of parts, and the intention network.

Every factory returns an ordinary composition of library modules, so the
result can be inspected, indexed and modified like a hand-built network.

*An actor-critic for a body of parts* (:func:`make_modular_actor_critic`, see
docs/modular_body.md): one actor head per action key, one critic per reward key.

*The intention network* (:func:`make_intention_network`): a variational
encoder of the reference, a decoder of ``[latent, proprioception]``.
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

import functools
import math
import numbers
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import jax
from flax import nnx

from nnx_ppo.envs.spaces import Box, Discrete, is_space, space_shape
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Filter, Flattener
from nnx_ppo.networks.variational import VariationalBottleneck

__all__ = [
    "make_mlp_layers", "make_mlp", "make_mlp_actor_critic", "make_recurrent_actor_critic", "make_actor_critic_for_env",
    "make_modular_actor_critic", "INTENTION_USERS_SIZE", "INTENTION_CPU_SIZE", "make_intention_network",
    "make_users_intention_network", "count_parameters",
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
    hidden = [Dense(n_in, n_out, rngs, activation=act) for n_in, n_out in zip(sizes[:-2], sizes[1:-1])]
    last = Dense(sizes[-2], sizes[-1], rngs, activation=act if activation_last_layer else None,
                 init_scale=last_layer_init_scale)
    return [*hidden, last]


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


def _is_shape(s: Any) -> bool:
    return isinstance(s, numbers.Integral) or (
        isinstance(s, tuple) and all(isinstance(d, numbers.Integral) for d in s))


def _width(shapes: Any, owner: str = "make_intention_network") -> int:
    """Flat width of a pytree of shapes (ints or tuples of ints); a ValueError names ``owner``."""
    leaves = jax.tree.leaves(shapes, is_leaf=_is_shape)
    if not leaves or not all(_is_shape(s) for s in leaves):
        raise ValueError(f"{owner}: expected shapes (ints or tuples of ints), got {shapes!r}")
    return sum(int(s) if isinstance(s, numbers.Integral) else math.prod(s) for s in leaves)


def _obs_front(obs_size: Any, normalize_obs: bool, owner: str) -> tuple[list[StatefulModule], int]:
    """Normalizer (optional) and Flattener for an int, tuple or dict of shapes."""
    layers: list[StatefulModule] = [Normalizer(obs_size)] if normalize_obs else []
    if not isinstance(obs_size, int):
        layers.append(Flattener())
    return layers, _width(obs_size, owner)


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
    front, flat = _obs_front(obs_size, resolved["normalize_obs"], factory)
    return resolved, rngs if rngs is not None else nnx.Rngs(0), front, flat


def _policy(n_in: int, action_size: int, discrete: bool, rngs: nnx.Rngs, entropy_weight: float, min_std: float,
            std_scale: float) -> list[StatefulModule]:
    """A policy head: a ``Dense`` producing logits (``discrete``) or mean and std
    (``2 * action_size``), then its sampler (built in that order, the RNG order)."""
    if discrete:
        return [Dense(n_in, action_size, rngs, init_scale=0.01),
                CategoricalSampler(rngs, entropy_weight=entropy_weight)]
    return [Dense(n_in, 2 * action_size, rngs, init_scale=0.01),
            NormalTanhSampler(rngs, entropy_weight=entropy_weight, min_std=min_std, std_scale=std_scale)]


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
    policy = _policy(policy_in, action_size, options["discrete"], rngs, options["entropy_weight"], options["min_std"],
                     options["std_scale"])
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
    obs_size = space_shape(env.observation_space)
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


# ----------------------------------------------------------------------------- a body of parts


def _observation_leaves(space: Any) -> list[tuple[tuple[str, ...], int]]:
    """``(dict-key path, flat width)`` of every leaf space of an observation
    space (``[((), width)]`` for a single ``Box``)."""
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(space, is_leaf=is_space)[0]:
        if not all(isinstance(entry, jax.tree_util.DictKey) for entry in path):
            raise TypeError(f"make_modular_actor_critic: observation spaces may nest dicts only, got "
                            f"{jax.tree_util.keystr(path)}")
        leaves.append((tuple(entry.key for entry in path), math.prod(space_shape(leaf))))
    return leaves


def _view(leaves: list[tuple[tuple[str, ...], int]], key: str | None,
          part_keys: set[str]) -> tuple[StatefulModule, int]:
    """``(module, width)``: what the head of ``key`` reads from the (normalized)
    observation, ``[B, width]``.

    The observation entries whose path holds ``key`` (its own:
    ``obs["target"][key]``) and those whose path holds none of ``part_keys``
    (the body's, shared by every head), picked by a :class:`Filter` and
    concatenated by a :class:`Flattener`; every entry when ``key`` is None or
    no entry's path holds it. A single ``Box`` observation is read whole.
    """
    if [path for path, _ in leaves] == [()]:
        return Flattener(), leaves[0][1]
    if not any(key in p for p, _ in leaves):
        key = None
    chosen = [(p, w) for p, w in leaves if key is None or key in p or not part_keys.intersection(p)]
    return Sequential([Filter({"/".join(p): p for p, _ in chosen}), Flattener()]), sum(w for _, w in chosen)


def make_modular_actor_critic(
    env: Any,
    rngs: nnx.Rngs | None = None,
    *,
    hidden_sizes: Sequence[int] = (64, 64),
    critic_hidden_sizes: Sequence[int] | None = None,
    observe: str = "part",
    activation: str | Callable = "swish",
    normalize_obs: bool = True,
    entropy_weight: float = 1e-3,
    min_std: float = 1e-2,
    std_scale: float = 1.0,
) -> Sequential:
    """An actor-critic for a body of parts: one actor head per action key, one critic per reward key.

    For an env with dict actions (``{"limb_0": Box((2,)), ...}``) and, usually,
    dict rewards with the same keys, as :class:`~nnx_ppo.envs.tasks.LimbReacher`.
    Every head is its own MLP. With ``observe="part"`` a head reads only the
    observation entries whose dict path holds its key (``obs["target"]["limb_0"]``
    for ``limb_0``) and the entries that belong to no part (a path with none of
    the action keys: body-wide observations); a head whose key no entry's path
    holds (a critic of a body-wide reward, ``"effort"``) and, with
    ``observe="body"``, every head reads the whole observation. The network is
    built of library modules::

        Sequential([
            Normalizer(obs shapes),                                # if normalize_obs
            PPOAdapter(
                action=Parallel({k: Sequential([Filter(view of k), Flattener(),
                                                MLP(hidden_sizes), Dense(2 A_k), NormalTanhSampler])}),
                value=Parallel({r: Sequential([Filter(view of r), Flattener(),
                                               MLP(critic_hidden_sizes), Dense(1)])}),
            ),
        ])

    so that for a batch of ``B`` envs the network outputs ``actions[k]``
    ``[B, A_k]`` (``[B]`` int32 for a ``Discrete`` part, drawn by a
    ``CategoricalSampler``), ``loglikelihoods[k]`` ``[B]`` and
    ``value_estimates[r]`` ``[B]``. A scalar reward gets one critic on the
    whole observation. With dict rewards keyed like the actions, PPO gives
    each head its own part's advantage (``PPOConfig.combine_advantages=False``)
    or the sum over parts (``True``); see docs/modular_body.md.

    Usable from the command line as ``--network
    nnx_ppo.networks.factories:make_modular_actor_critic``, with the defaults
    below or others through ``--network-kwargs``, e.g.
    ``'{"hidden_sizes": [32, 32]}'``.

    Args:
      env: the env (its ``observation_space``, ``action_space``, a dict, and
        the structure of its reset reward are read; nothing is run).
      rngs: parameter and sampling RNGs (default ``nnx.Rngs(0)``).
      hidden_sizes: hidden widths of each actor head's MLP.
      critic_hidden_sizes: hidden widths of each critic's MLP (default: ``hidden_sizes``).
      observe: ``"part"`` (each head sees its own and the body-wide entries) or ``"body"`` (everything).
      activation: name (``relu``, ``tanh``, ``elu``, ``swish``, ``gelu``) or callable.
      normalize_obs: start with a running-statistics :class:`Normalizer`.
      entropy_weight: weight of each sampler's entropy bonus.
      min_std: floor of the Gaussian std.
      std_scale: multiplies the Gaussian std.

    Raises:
      TypeError: the action space is not a dict of ``Box`` and ``Discrete`` spaces.
      ValueError: an unknown ``observe`` or activation.
    """
    if observe not in ("part", "body"):
        raise ValueError(f"make_modular_actor_critic: observe must be 'part' or 'body', got {observe!r}")
    actions = env.action_space
    if not (isinstance(actions, dict) and actions and all(isinstance(s, (Box, Discrete)) for s in actions.values())):
        raise TypeError(f"make_modular_actor_critic: needs an env whose action_space is a dict of Box and Discrete "
                        f"spaces, one per part, got {actions!r}; for one action use make_actor_critic_for_env")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    critic_hidden_sizes = hidden_sizes if critic_hidden_sizes is None else critic_hidden_sizes
    reward = jax.eval_shape(env.reset, jax.random.key(0)).reward
    reward_keys = list(reward) if isinstance(reward, dict) else None
    leaves = _observation_leaves(env.observation_space)
    part_keys = set(actions) | set(reward_keys or ())

    def head(key: str | None, sizes: Sequence[int], out: Callable[[int], list[StatefulModule]]) -> Sequential:
        """The view of ``key`` (everything for None, or with ``observe="body"``),
        an MLP of ``sizes`` and the output layers ``out(width)``."""
        view, width = _view(leaves, None if observe == "body" else key, part_keys)
        mlp = make_mlp_layers([width, *sizes], rngs, activation) if sizes else []
        return Sequential([view, *mlp, *out(sizes[-1] if sizes else width)])

    def policy_out(space) -> Callable[[int], list[StatefulModule]]:
        discrete = isinstance(space, Discrete)
        size = space.n if discrete else math.prod(space_shape(space))
        return lambda n_in: _policy(n_in, size, discrete, rngs, entropy_weight, min_std, std_scale)

    def value_out(n_in: int) -> list[StatefulModule]:
        return [Dense(n_in, 1, rngs)]

    action = Parallel({k: head(k, hidden_sizes, policy_out(space)) for k, space in actions.items()})
    if reward_keys is None:
        value = head(None, critic_hidden_sizes, value_out)
    else:
        value = Parallel({r: head(r, critic_hidden_sizes, value_out) for r in reward_keys})
    front: list[StatefulModule] = [Normalizer(space_shape(env.observation_space))] if normalize_obs else []
    return Sequential([*front, PPOAdapter(action=action, value=value)])


# ----------------------------------------------------------------------------- the intention network


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


def _entry(observation_size: Mapping, key: str | tuple, role: str) -> Any:
    """The shapes of the observation entry at ``key`` (a key or a tuple path)."""
    value: Any = observation_size
    for part in (key if isinstance(key, tuple) else (key,)):
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
        observation_size = space_shape(env.observation_space)
    if not isinstance(observation_size, Mapping):
        raise TypeError(f"make_intention_network: the observation must be a dict holding the reference "
                        f"and the proprioception, got shapes {observation_size!r}")
    return observation_size


def _action_width(env: Any, action_size: int | None) -> int:
    """``A``: ``action_size``, or the flat size of the env's ``Box`` action space."""
    if action_size is None:
        if env is None:
            raise TypeError("make_intention_network: pass an env or action_size")
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
    nnx_ppo.networks.factories:make_intention_network`` (the defaults: the
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
        *_policy(head_in, n_action, False, rngs, entropy_weight, min_std, std_scale),
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
    nnx_ppo.networks.factories:make_users_intention_network``."""
    return make_intention_network(env, rngs, **{**INTENTION_USERS_SIZE, **kwargs})
