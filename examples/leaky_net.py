"""A network of your own: a leaky integrator with a learned decay between
an encoder and the actor-critic heads. ``make_net(env, rngs)`` is what
``nnx-ppo train --network examples/leaky_net.py:make_net`` calls (see
custom_module_cli.py and docs/own_network.md)."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


class LeakyIntegrator(StatefulModule):
    """h <- sigmoid(a) * h + x per unit, a learned; the carry is h, ``[B, size]``."""

    def __init__(self, size: int):
        self.size = size
        self.a = nnx.Param(jnp.full((size,), 2.0))

    def __call__(self, state, x, rollout_extras=None):
        h = jax.nn.sigmoid(self.a[...])[None, :] * state + x
        return StatefulModuleOutput(next_state=h, output=jnp.tanh(h))

    def initialize_state(self, batch_size):
        return jnp.zeros((batch_size, self.size))


def make_net(env, rngs, width: int = 32):
    """Encoder, leaky integrator, then a categorical actor and a critic."""
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.n
    return Sequential([
        Dense(n_obs, width, rngs, activation=jnp.tanh),
        LeakyIntegrator(width),
        PPOAdapter(action=Sequential([Dense(width, n_actions, rngs), CategoricalSampler(rngs)]),
                   value=Dense(width, 1, rngs)),
    ])
