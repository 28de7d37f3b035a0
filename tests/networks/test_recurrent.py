"""Tests for nnx_ppo.networks.recurrent (LSTM, GRU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.recurrent import GRU, LSTM
from nnx_ppo.networks.types import StatefulModuleOutput, select_where

B, D_IN, H = 3, 4, 5


def _np_sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _x(seed=0, b=B):
    return jax.random.normal(jax.random.key(seed), (b, D_IN))


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_carry_and_output_shapes(cls):
    m = cls(D_IN, H, nnx.Rngs(0))
    state = m.initialize_state(B)
    out = m(state, _x())
    assert isinstance(out, StatefulModuleOutput)
    assert out.output.shape == (B, H)
    assert jax.tree.map(jnp.shape, out.next_state) == jax.tree.map(jnp.shape, state)
    assert out.rollout_extras is None
    assert jnp.ndim(out.regularization_loss) == 0
    if cls is LSTM:
        assert set(state) == {"h", "c"}
        assert state["h"].shape == (B, H) and state["c"].shape == (B, H)
        np.testing.assert_allclose(out.output, out.next_state["h"])
    else:
        assert state.shape == (B, H)
        np.testing.assert_allclose(out.output, out.next_state)
    for leaf in jax.tree.leaves(state):
        np.testing.assert_array_equal(leaf, 0.0)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_rngs_by_keyword(cls):
    m = cls(in_features=D_IN, hidden_features=H, rngs=nnx.Rngs(1))
    assert m(m.initialize_state(2), _x(b=2)).output.shape == (2, H)


def test_lstm_matches_reference_maths():
    m = LSTM(D_IN, H, nnx.Rngs(0))
    x = np.asarray(_x(1))
    h = np.asarray(jax.random.normal(jax.random.key(2), (B, H)))
    c = np.asarray(jax.random.normal(jax.random.key(3), (B, H)))
    out = m({"h": jnp.asarray(h), "c": jnp.asarray(c)}, jnp.asarray(x))
    z = x @ np.asarray(m.kernel_x[...]) + h @ np.asarray(m.kernel_h[...]) + np.asarray(m.bias[...])
    i, f, g, o = np.split(z, 4, axis=-1)
    c_new = _np_sigmoid(f) * c + _np_sigmoid(i) * np.tanh(g)
    h_new = _np_sigmoid(o) * np.tanh(c_new)
    np.testing.assert_allclose(out.next_state["c"], c_new, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.output, h_new, rtol=1e-5, atol=1e-5)
    # the forget bias starts at 1
    np.testing.assert_array_equal(np.asarray(m.bias[...])[H:2 * H], 1.0)


def test_gru_matches_reference_maths():
    m = GRU(D_IN, H, nnx.Rngs(0))
    x = np.asarray(_x(1))
    h = np.asarray(jax.random.normal(jax.random.key(2), (B, H)))
    out = m(jnp.asarray(h), jnp.asarray(x))
    kx, kh = np.asarray(m.kernel_x[...]), np.asarray(m.kernel_h[...])
    bx, bhn = np.asarray(m.bias_x[...]), np.asarray(m.bias_hn[...])
    zx = x @ kx + bx
    r = _np_sigmoid(zx[:, :H] + h @ kh[:, :H])
    u = _np_sigmoid(zx[:, H:2 * H] + h @ kh[:, H:2 * H])
    n = np.tanh(zx[:, 2 * H:] + r * (h @ kh[:, 2 * H:] + bhn))
    np.testing.assert_allclose(out.output, (1 - u) * n + u * h, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_reset_returns_initial_state(cls):
    m = cls(D_IN, H, nnx.Rngs(0))
    state = m.initialize_state(B)
    for t in range(2):
        state = m(state, _x(t)).next_state
    assert any(float(jnp.abs(leaf).sum()) > 0 for leaf in jax.tree.leaves(state))
    reset = m.reset_state(state)
    for leaf in jax.tree.leaves(reset):
        assert leaf.shape == (B, H)
        np.testing.assert_array_equal(leaf, 0.0)
    # the trainer's per-env reset
    done = jnp.array([True, False, True])
    mixed = select_where(done, reset, state)
    for m_leaf, s_leaf in zip(jax.tree.leaves(mixed), jax.tree.leaves(state)):
        np.testing.assert_array_equal(m_leaf[0], 0.0)
        np.testing.assert_array_equal(m_leaf[1], s_leaf[1])


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_trainable_initial_state_gets_gradient(cls):
    m = cls(D_IN, H, nnx.Rngs(0), trainable_initial_state=True)
    x = _x()

    def loss(mod):
        state = mod.initialize_state(B)
        out = mod(state, x)
        out = mod(mod.reset_state(out.next_state), x)
        return jnp.sum(out.output ** 2) + jnp.sum(out.output)

    grads = nnx.grad(loss)(m)
    g_h = grads["initial_h"][...]
    assert g_h.shape == (H,)
    assert float(jnp.abs(g_h).sum()) > 0
    if cls is LSTM:
        assert float(jnp.abs(grads["initial_c"][...]).sum()) > 0
    # the initial state is the parameter tiled over the batch
    m.initial_h[...] = jnp.arange(H, dtype=jnp.float32)
    state = m.initialize_state(2)
    h0 = state["h"] if cls is LSTM else state
    np.testing.assert_array_equal(h0, np.tile(np.arange(H, dtype=np.float32), (2, 1)))
    reset_h = m.reset_state(state)
    reset_h = reset_h["h"] if cls is LSTM else reset_h
    np.testing.assert_array_equal(reset_h, h0)


def test_no_initial_state_params_by_default():
    m = LSTM(D_IN, H, nnx.Rngs(0))
    assert not hasattr(m, "initial_h")


def test_shape_errors_name_module_and_argument():
    m = LSTM(5, H, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"LSTM: x has shape \(4, 3\), expected \(B, 5\) \(in_features=5\)"):
        m(m.initialize_state(4), jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"LSTM: state\['h'\] has shape"):
        m({"h": jnp.zeros((4, 2)), "c": jnp.zeros((4, H))}, jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match="LSTM: state\\['c'\\] has batch size 2"):
        m({"h": jnp.zeros((4, H)), "c": jnp.zeros((2, H))}, jnp.zeros((4, 5)))
    g = GRU(5, H, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"GRU: x has shape \(4,\), expected \(B, 5\)"):
        g(g.initialize_state(4), jnp.zeros((4,)))
    with pytest.raises(ValueError, match=r"GRU: state has shape \(4, 3\), expected \(B, 5\)"):
        g(jnp.zeros((4, 3)), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match="GRU: hidden_features"):
        GRU(5, 0, nnx.Rngs(0))


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_jit_split_merge_matches_eager(cls):
    m = cls(D_IN, H, nnx.Rngs(0))
    graphdef, params = nnx.split(m)

    @jax.jit
    def step(params, state, x):
        out = nnx.merge(graphdef, params)(state, x)
        return out.next_state, out.output

    state_e = state_j = m.initialize_state(B)
    for t in range(3):
        out = m(state_e, _x(t))
        state_e = out.next_state
        state_j, y = step(params, state_j, _x(t))
        np.testing.assert_allclose(y, out.output, rtol=1e-5, atol=1e-6)


def test_lstm_forget_bias_sets_the_initial_forget_gate():
    from flax import nnx

    from nnx_ppo.networks.factories import make_recurrent_actor_critic
    from nnx_ppo.networks.recurrent import LSTM

    h = 5
    cell = LSTM(3, h, nnx.Rngs(0), forget_bias=3.0)
    bias = np.asarray(cell.bias[...])
    np.testing.assert_array_equal(bias[h:2 * h], 3.0)
    np.testing.assert_array_equal(np.delete(bias, np.s_[h:2 * h]), 0.0)
    np.testing.assert_array_equal(np.asarray(LSTM(3, h, nnx.Rngs(0)).bias[...])[h:2 * h], 1.0)  # the default
    with pytest.raises(ValueError, match="forget_bias must be a finite number"):
        LSTM(3, h, nnx.Rngs(0), forget_bias=float("inf"))
    with pytest.raises(ValueError, match="the GRU core has none"):
        make_recurrent_actor_critic(3, 2, nnx.Rngs(0), core="gru", forget_bias=3.0)
    net = make_recurrent_actor_critic(3, 2, nnx.Rngs(0), hidden_size=h, encoder_sizes=(4,), forget_bias=2.0)
    biases = [np.asarray(m.bias[...])[h:2 * h] for _, m in nnx.iter_modules(net) if isinstance(m, LSTM)]
    assert len(biases) == 2 and all((b == 2.0).all() for b in biases)  # actor's and critic's cores
