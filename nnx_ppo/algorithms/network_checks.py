"""Checks that a network fits an env before anything compiles (shapes only)."""

from __future__ import annotations

import jax

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.envs.validation import check_actions, check_env_structure

__all__ = ["check_network_matches_env"]


def check_network_matches_env(env, network, config: PPOConfig) -> None:
    """Fail early, with names, when the network's value output does not match
    the reward structure or its outputs have the wrong batch shape."""
    B = config.n_envs
    env_state = jax.eval_shape(lambda k: jax.vmap(env.reset)(jax.random.split(k, B)), jax.random.key(0))

    def forward(net: NetworkFn, obs):
        carry, net = net.initialize(B)
        return net.apply(carry, obs)[0].output

    out = jax.eval_shape(forward, NetworkFn.of(network), env_state.obs)
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
    check_actions(env, out.actions, B)
