"""An actor-critic for a body of parts: one actor head per action key, one
critic per reward key (:func:`make_modular_actor_critic`, see
docs/modular_body.md), built of library modules."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from nnx_ppo.envs.spaces import is_space
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Parallel, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Filter, Flattener

__all__ = ["make_modular_actor_critic"]


def _observation_leaves(space: Any) -> list[tuple[tuple[str, ...], int]]:
    """``(dict-key path, flat width)`` of every leaf space of an observation
    space (``[((), width)]`` for a single ``Box``)."""
    from nnx_ppo.envs.spaces import space_shape

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
    nnx_ppo.networks.modular:make_modular_actor_critic``, with the defaults
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
    from nnx_ppo.envs.spaces import Box, Discrete, space_shape
    from nnx_ppo.networks.factories import make_mlp_layers

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
        if isinstance(space, Discrete):
            return lambda n_in: [Dense(n_in, space.n, rngs, init_scale=0.01),
                                 CategoricalSampler(rngs, entropy_weight=entropy_weight)]
        size = math.prod(space_shape(space))
        return lambda n_in: [Dense(n_in, 2 * size, rngs, init_scale=0.01),
                             NormalTanhSampler(rngs, entropy_weight=entropy_weight, min_std=min_std,
                                               std_scale=std_scale)]

    def value_out(n_in: int) -> list[StatefulModule]:
        return [Dense(n_in, 1, rngs)]

    action = Parallel({k: head(k, hidden_sizes, policy_out(space)) for k, space in actions.items()})
    if reward_keys is None:
        value = head(None, critic_hidden_sizes, value_out)
    else:
        value = Parallel({r: head(r, critic_hidden_sizes, value_out) for r in reward_keys})
    front: list[StatefulModule] = []
    if normalize_obs:
        front.append(Normalizer(jax.tree.map(space_shape, env.observation_space, is_leaf=is_space)))
    return Sequential([*front, PPOAdapter(action=action, value=value)])
