"""Calls written for the original nnx-ppo 0.3.0, positionally: each either
means the same here or is a TypeError (never a silent change of meaning)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks import (
    LSTM,
    AR1VariationalBottleneck,
    Delay,
    Dense,
    NormalTanhSampler,
    VariationalBottleneck,
    make_mlp_actor_critic,
)


@pytest.mark.parametrize("call", [
    # original: (latent_size, rng, kl_weight, min_std, ar1_weight, backprop_through_time)
    lambda: AR1VariationalBottleneck(4, nnx.Rngs(0), 0.1, 1e-4, 0.5, True),
    lambda: AR1VariationalBottleneck(4, nnx.Rngs(0), 0.1, 1e-4, 0.5),
    lambda: AR1VariationalBottleneck(4, nnx.Rngs(0), 0.1, 1e-4),  # ar1_weight defaulted to 1 there
    lambda: AR1VariationalBottleneck(4, nnx.Rngs(0), 0.1, ar1_weight=0.5),
    lambda: Dense(3, 2, nnx.Rngs(0), jax.nn.relu),  # activation was the 4th positional
    lambda: make_mlp_actor_critic(3, 2, [8], [8], nnx.Rngs(0), nnx.relu),  # activation
])
def test_original_positional_calls_that_would_mean_something_else_are_errors(call):
    with pytest.raises(TypeError):
        call()


def test_variational_bottleneck_positional_call_means_the_same():
    """Original (latent_size, rng, kl_weight, min_std): same positions, same
    maths (std = softplus + min_std, loss = kl_weight * batch mean of the KL
    summed over the latent axis)."""
    m = VariationalBottleneck(2, nnx.Rngs(0), 0.5, 0.1)
    assert (m.kl_weight, m.min_std) == (0.5, 0.1)
    x = jnp.array([[0.3, -0.2, 0.1, -1.0], [1.0, 0.5, -0.4, 0.2]])
    out = m(m.initialize_state(2), x)
    mean, std = x[:, :2], jax.nn.softplus(x[:, 2:]) + 0.1
    kl = jnp.sum(0.5 * (mean**2 + std**2 - 2 * jnp.log(std) - 1), axis=-1)
    np.testing.assert_allclose(out.regularization_loss, 0.5 * jnp.mean(kl), rtol=1e-6)


def test_ar1_bottleneck_keeps_the_shared_positions():
    m = AR1VariationalBottleneck(4, nnx.Rngs(0), 0.1, 1e-4, smoothness_weight=0.5 / 4)
    assert (m.kl_weight, m.min_std, m.smoothness_weight) == (0.1, 1e-4, 0.125)


def test_other_positional_calls_mean_the_same():
    s = NormalTanhSampler(nnx.Rngs(0), 0.01, 0.2, 2.0)  # (rng, entropy_weight, min_std, std_scale)
    assert (s.entropy_weight, s.min_std, s.std_scale) == (0.01, 0.2, 2.0)
    lstm = LSTM(3, 5, nnx.Rngs(0))  # (in_features, hidden_features, rngs)
    assert lstm.initialize_state(2)[0].shape == (2, 5)


def test_delay_positional_call_means_the_same():
    """Original ``Delay(sample_input, k_steps, initial_value)``: the third
    positional argument fills the buffer; the carry is the original's
    ``{"buffer", "idx"}`` ring buffer."""
    d = Delay(jnp.zeros(3), 2, 0.5)
    state = d.initialize_state(4)
    assert state["buffer"].shape == (4, 2, 3) and state["idx"].dtype == jnp.int32
    np.testing.assert_array_equal(d(state, jnp.ones((4, 3))).output, 0.5)
