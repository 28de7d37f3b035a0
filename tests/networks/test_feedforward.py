"""Tests for nnx_ppo.networks.feedforward (Dense)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.feedforward import Dense

B = 3


def _x(d, seed=0):
    return jax.random.normal(jax.random.key(seed), (B, d))


def test_shapes_and_affine_maths():
    d = Dense(4, 2, nnx.Rngs(0))
    assert d.kernel[...].shape == (4, 2) and d.bias[...].shape == (2,)
    assert d.initialize_state(B) == ()
    d.bias[...] = jnp.array([1.0, -1.0])
    x = _x(4)
    out = d(d.initialize_state(B), x)
    assert out.output.shape == (B, 2)
    np.testing.assert_allclose(out.output, np.asarray(x) @ np.asarray(d.kernel[...]) + [1.0, -1.0],
                               rtol=1e-5, atol=1e-6)
    assert out.next_state == () and out.rollout_extras is None
    assert out.metrics == {} and float(out.regularization_loss) == 0.0
    assert d.reset_state(()) == ()


def test_activation_and_no_bias():
    plain = Dense(4, 3, nnx.Rngs(0))
    relu = Dense(4, 3, nnx.Rngs(0), activation=jax.nn.relu)
    np.testing.assert_array_equal(relu.kernel[...], plain.kernel[...])
    x = _x(4)
    np.testing.assert_allclose(relu((), x).output, jax.nn.relu(plain((), x).output), rtol=1e-6)
    assert float(relu((), x).output.min()) >= 0.0
    nobias = Dense(4, 3, nnx.Rngs(0), use_bias=False)
    assert nobias.bias is None
    np.testing.assert_allclose(nobias((), x).output, x @ nobias.kernel[...], rtol=1e-6)


def test_init_scale_and_custom_init():
    big = Dense(8, 8, nnx.Rngs(0))
    small = Dense(8, 8, nnx.Rngs(0), init_scale=0.01)
    np.testing.assert_allclose(small.kernel[...], 0.01 * big.kernel[...], rtol=1e-5, atol=1e-8)
    ones = Dense(2, 3, nnx.Rngs(0), kernel_init=nnx.initializers.ones)
    np.testing.assert_array_equal(ones.kernel[...], 1.0)


def test_shape_error_names_module_argument_and_shape():
    d = Dense(5, 2, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"Dense: x has shape \(3, 4\), expected \(B, 5\) \(in_features=5\)"):
        d((), jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"Dense: x has shape \(5,\), expected \(B, 5\)"):
        d((), jnp.zeros((5,)))
    with pytest.raises(ValueError, match="Dense: in_features and out_features must be positive"):
        Dense(0, 2, nnx.Rngs(0))


def test_jit_with_split_merge():
    d = Dense(4, 2, nnx.Rngs(0), activation=jnp.tanh)
    graphdef, params = nnx.split(d)

    @jax.jit
    def f(params, x):
        return nnx.merge(graphdef, params)((), x).output

    x = _x(4, seed=1)
    np.testing.assert_allclose(f(params, x), d((), x).output, rtol=1e-5, atol=1e-6)
    # gradients reach kernel and bias
    grads = nnx.grad(lambda m: jnp.sum(m((), x).output))(d)
    assert float(jnp.abs(grads["linear"]["kernel"][...]).sum()) > 0
    assert float(jnp.abs(grads["linear"]["bias"][...]).sum()) > 0
