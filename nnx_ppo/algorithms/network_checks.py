"""Checks that a network fits an env before anything compiles (shapes only)."""

from __future__ import annotations

import jax

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.envs.spaces import Discrete
from nnx_ppo.envs.types import check_actions, check_env_structure
from nnx_ppo.networks.sampling_layers import categorical_choices

__all__ = ["check_network_matches_env"]


def _check_carry(what: str, initial, other) -> None:
    """The carry keeps its tree, shapes and dtypes from step to step (the
    rollout scans it); a ValueError names the first leaf that changes."""
    if jax.tree.structure(initial) != jax.tree.structure(other):
        raise ValueError(
            f"the network's carry changes structure: initialize_state gives {jax.tree.structure(initial)}, "
            f"{what} is {jax.tree.structure(other)}; a module must return a carry like the one it was given "
            "(see docs/custom_modules.md)"
        )
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(initial), jax.tree.leaves(other)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(
                f"the network's carry leaf {jax.tree_util.keystr(path)} is {a.shape} {a.dtype} from "
                f"initialize_state but {b.shape} {b.dtype} in {what}; a module must keep its carry's shapes and "
                "dtypes from step to step (see docs/custom_modules.md)"
            )


def check_network_matches_env(env, network, config: PPOConfig) -> None:
    """Fail early, with names, when the network's value output does not match
    the reward structure or its outputs have the wrong batch shape."""
    B = config.n_envs
    env_state = jax.eval_shape(lambda k: jax.vmap(env.reset)(jax.random.split(k, B)), jax.random.key(0))

    def forward(net: NetworkFn, obs):
        carry, net = net.initialize(B)
        step, net = net.apply(carry, obs)
        reset, _ = net.reset(step.next_state)
        return carry, step.next_state, reset, step.output

    with categorical_choices() as choices:
        carry, next_carry, reset_carry, out = jax.eval_shape(forward, NetworkFn.of(network), env_state.obs)
    _check_carry("__call__'s next_state", carry, next_carry)
    _check_carry("reset_state's carry", carry, reset_carry)
    check_actions(env, out.actions, B)  # before the env steps with them
    space = getattr(env, "action_space", None)
    wrong = sorted({n for n in choices if isinstance(space, Discrete) and n != space.n})
    if wrong:
        raise ValueError(f"the network's CategoricalSampler chooses among {wrong[0]} actions, but the env's action "
                         f"space is {space}; give the policy head {space.n} outputs")
    check_env_structure(env, B, actions=out.actions)
    reward_tree = jax.tree.structure(env_state.reward)
    value_tree = jax.tree.structure(out.value_estimates)
    if reward_tree != value_tree:
        raise ValueError(
            f"the network's value_estimates have structure {value_tree} but the env's rewards have "
            f"structure {reward_tree}; give the value port one head per reward key"
        )
    for name, tree in (("value_estimates", out.value_estimates), ("loglikelihoods", out.loglikelihoods)):
        for leaf in jax.tree.leaves(tree):
            if leaf.shape != (B,):
                raise ValueError(f"the network's {name} have shape {leaf.shape}, expected ({B},) = (n_envs,)")
