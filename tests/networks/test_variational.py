"""Tests for nnx_ppo.networks.variational."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.types import select_where
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck

L, B, T = 3, 4, 3


def _make(kind, **kw):
    if kind == "vb":
        return VariationalBottleneck(L, nnx.Rngs(0), 0.5, **kw)
    return AR1VariationalBottleneck(L, nnx.Rngs(0), 0.5, smoothness_weight=2.0, **kw)


def _xs(t_steps=T, b=B, seed=0):
    return jax.random.normal(jax.random.key(seed), (t_steps, b, 2 * L))


def _run(module, state, xs):
    outs = []
    for x in xs:
        out = module(state, x)
        state = out.next_state
        outs.append(out)
    return state, outs


def _key_data(tree):
    return jax.tree.map(lambda a: jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a, tree)


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(_key_data(a)), jax.tree.leaves(_key_data(b))):
        np.testing.assert_array_equal(x, y)


def _np_kl(x):
    x = np.asarray(x, np.float64)
    mean, pre = x[:, :L], x[:, L:]
    std = np.log1p(np.exp(pre)) + 1e-6
    return np.sum(0.5 * (mean ** 2 + std ** 2 - 1) - np.log(std), axis=-1)


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_carry_shapes(kind):
    m = _make(kind)
    state = m.initialize_state(B)
    keys = state if kind == "vb" else state["key"]
    assert keys.shape == (B,) and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    if kind == "ar1":
        assert state["prev_z"].shape == (B, L)
        assert state["has_previous"].shape == (B,) and state["has_previous"].dtype == jnp.bool_
    out = m(state, _xs()[0])
    assert out.output.shape == (B, L)
    assert jax.tree.map(jnp.shape, out.next_state) == jax.tree.map(jnp.shape, state)
    assert out.rollout_extras is None
    # different envs get different noise
    ones = jnp.zeros((B, 2 * L))
    z = m(state, ones).output
    assert not np.allclose(z[0], z[1])


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_kl_matches_closed_form(kind):
    m = _make(kind)
    x = _xs()[0]
    out = m(m.initialize_state(B), x)
    kl = _np_kl(x)
    np.testing.assert_allclose(out.metrics["kl_divergence"], kl.mean(), rtol=1e-5)
    if kind == "vb":
        np.testing.assert_allclose(out.regularization_loss, 0.5 * kl.mean(), rtol=1e-5)
    else:  # first step: no smoothness term
        np.testing.assert_allclose(out.regularization_loss, 0.5 * kl.mean(), rtol=1e-5)
        np.testing.assert_allclose(out.metrics["smoothness"], 0.0)


def test_sample_is_reparameterised():
    m = VariationalBottleneck(L, nnx.Rngs(0), 1.0, min_std=0.0)
    state = m.initialize_state(B)
    mean = jnp.arange(B * L, dtype=jnp.float32).reshape(B, L)
    # std -> 0: z == mean
    z = m(state, jnp.concatenate([mean, jnp.full((B, L), -100.0)], axis=1)).output
    np.testing.assert_allclose(z, mean, atol=1e-5)
    # gradient w.r.t. the mean is 1
    g = jax.grad(lambda mu: m(state, jnp.concatenate([mu, jnp.zeros((B, L))], axis=1)).output.sum())(mean)
    np.testing.assert_allclose(g, 1.0)


def test_samples_look_standard_normal():
    m = VariationalBottleneck(64, nnx.Rngs(3), 1.0, min_std=0.0)
    state = m.initialize_state(8)
    pre = jnp.full((8, 64), float(np.log(np.e - 1.0)))  # softplus(pre) == 1
    z = m(state, jnp.concatenate([jnp.zeros((8, 64)), pre], axis=1)).output
    assert abs(float(z.mean())) < 0.2 and abs(float(z.std()) - 1.0) < 0.15


def test_ar1_smoothness_penalty_and_reset():
    m = _make("ar1")
    xs = _xs()
    state = m.initialize_state(B)
    o1 = m(state, xs[0])
    o2 = m(o1.next_state, xs[1])
    sq = np.sum((np.asarray(o2.output) - np.asarray(o1.output)) ** 2, axis=-1)
    np.testing.assert_allclose(o2.metrics["smoothness"], sq.mean(), rtol=1e-5)
    np.testing.assert_allclose(o2.regularization_loss, 0.5 * _np_kl(xs[1]).mean() + 2.0 * sq.mean(), rtol=1e-5)
    assert bool(jnp.all(o2.next_state["has_previous"]))
    # reset env 0 only: its penalty is 0 on the next step
    reset = m.reset_state(o2.next_state)
    np.testing.assert_array_equal(reset["prev_z"], 0.0)
    assert not bool(jnp.any(reset["has_previous"]))
    _assert_trees_equal(reset["key"], o2.next_state["key"])  # key chain kept
    mixed = select_where(jnp.array([True, False, False, False]), reset, o2.next_state)
    o3 = m(mixed, xs[2])
    sq3 = np.sum((np.asarray(o3.output) - np.asarray(o2.output)) ** 2, axis=-1)
    sq3[0] = 0.0
    np.testing.assert_allclose(o3.metrics["smoothness"], sq3.mean(), rtol=1e-5)


def test_ar1_smoothness_gradient_flows_to_both_steps():
    m = _make("ar1")
    xs = _xs()
    s = m.initialize_state(B)  # outside the trace: it advances the module's nnx.Rngs

    def loss(x0, x1):
        o1 = m(s, x0)
        return m(o1.next_state, x1).metrics["smoothness"]

    g0, g1 = jax.grad(loss, argnums=(0, 1))(xs[0], xs[1])
    assert float(jnp.abs(g0).sum()) > 0 and float(jnp.abs(g1).sum()) > 0


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_reset_keeps_key_chain_by_default(kind):
    m = _make(kind)
    state, _ = _run(m, m.initialize_state(B), _xs())
    reset = m.reset_state(state)
    keys_before = state if kind == "vb" else state["key"]
    keys_after = reset if kind == "vb" else reset["key"]
    _assert_trees_equal(keys_after, keys_before)


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_fresh_keys_on_reset(kind):
    m = _make(kind, fresh_keys_on_reset=True)
    state, _ = _run(m, m.initialize_state(B), _xs())
    reset = m.reset_state(state)
    keys_before = state if kind == "vb" else state["key"]
    keys_after = reset if kind == "vb" else reset["key"]
    assert keys_after.shape == (B,)
    assert not np.array_equal(jax.random.key_data(keys_after), jax.random.key_data(keys_before))
    # fresh keys differ per env and from a second reset
    again = m.reset_state(state)
    again = again if kind == "vb" else again["key"]
    assert not np.array_equal(jax.random.key_data(again), jax.random.key_data(keys_after))


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_same_carry_same_input_same_output(kind):
    m = _make(kind)
    state = m.initialize_state(B)
    x = _xs()[0]
    a, b = m(state, x), m(state, x)
    np.testing.assert_array_equal(a.output, b.output)
    _assert_trees_equal(a.next_state, b.next_state)


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_batch_equals_two_halves_over_several_steps(kind):
    m = _make(kind)
    state = m.initialize_state(B)
    xs = _xs()
    full_state, full = _run(m, state, xs)
    h = B // 2
    halves = []
    for sl in (slice(0, h), slice(h, B)):
        st = jax.tree.map(lambda a, sl=sl: a[sl], state)
        st, outs = _run(m, st, xs[:, sl])
        halves.append((st, outs))
    for t in range(T):
        joined = jnp.concatenate([halves[0][1][t].output, halves[1][1][t].output], axis=0)
        np.testing.assert_array_equal(joined, full[t].output)
    joined_state = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=0), halves[0][0], halves[1][0])
    _assert_trees_equal(joined_state, full_state)


@pytest.mark.parametrize("kind", ["vb", "ar1"])
def test_jit_split_merge_matches_eager(kind):
    m = _make(kind)
    graphdef, st = nnx.split(m)

    @jax.jit
    def step(st, carry, x):
        out = nnx.merge(graphdef, st)(carry, x)
        return out.next_state, out.output, out.regularization_loss

    state = m.initialize_state(B)
    carry_e = carry_j = state
    for x in _xs():
        out = m(carry_e, x)
        carry_e = out.next_state
        carry_j, y, loss = step(st, carry_j, x)
        np.testing.assert_allclose(y, out.output, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(loss, out.regularization_loss, rtol=1e-5)


def test_initialize_state_under_jit_split_merge():
    m = VariationalBottleneck(L, nnx.Rngs(0), 1.0)
    graphdef, st = nnx.split(m)

    @jax.jit
    def init(st):
        mod = nnx.merge(graphdef, st)
        keys = mod.initialize_state(B)
        return keys, nnx.state(mod)

    keys_j, st2 = init(st)
    keys_e = m.initialize_state(B)
    np.testing.assert_array_equal(jax.random.key_data(keys_j), jax.random.key_data(keys_e))


def test_errors_name_module_and_argument():
    m = VariationalBottleneck(L, nnx.Rngs(0), 1.0)
    with pytest.raises(ValueError, match=r"VariationalBottleneck: x has shape \(4, 5\), expected \(B, 6\)"):
        m(m.initialize_state(4), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"VariationalBottleneck: key carry has shape \(3,\), expected \(4,\)"):
        m(m.initialize_state(3), jnp.zeros((4, 6)))
    a = AR1VariationalBottleneck(L, nnx.Rngs(0), 1.0, smoothness_weight=1.0)
    with pytest.raises(ValueError, match=r"AR1VariationalBottleneck: x has shape"):
        a(a.initialize_state(4), jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match="AR1VariationalBottleneck: smoothness_weight"):
        AR1VariationalBottleneck(L, nnx.Rngs(0), 1.0, smoothness_weight=-1.0)
    with pytest.raises(ValueError, match="VariationalBottleneck: latent_size"):
        VariationalBottleneck(0, nnx.Rngs(0), 1.0)
