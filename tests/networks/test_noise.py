"""Tests for nnx_ppo.networks.noise (GaussianNoise, DropoutMask, BernoulliGate)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.noise import BernoulliGate, DropoutMask, GaussianNoise
from nnx_ppo.networks.types import select_where

B, D, T = 4, 5, 3

FACTORIES = {
    "gaussian": lambda **kw: GaussianNoise(0.5, nnx.Rngs(0), **kw),
    "dropout": lambda **kw: DropoutMask(0.5, nnx.Rngs(0), **kw),
    "gate": lambda **kw: BernoulliGate(nnx.Rngs(0), **kw),
    "gate_gumbel": lambda **kw: BernoulliGate(nnx.Rngs(0), estimator="gumbel_straight_through",
                                              temperature=0.5, **kw),
}
KINDS = list(FACTORIES)


def _xs(t_steps=T, b=B, seed=0):
    return jax.random.normal(jax.random.key(seed), (t_steps, b, D))


def _run(module, state, xs):
    outs = []
    for x in xs:
        out = module(state, x)
        state = out.next_state
        outs.append(out.output)
    return state, outs


def _kd(keys):
    return np.asarray(jax.random.key_data(keys))


@pytest.mark.parametrize("kind", KINDS)
def test_carry_is_one_key_per_env(kind):
    m = FACTORIES[kind]()
    state = m.initialize_state(B)
    assert state.shape == (B,) and jnp.issubdtype(state.dtype, jax.dtypes.prng_key)
    assert len({tuple(k) for k in _kd(state)}) == B
    out = m(state, _xs()[0])
    assert out.output.shape == (B, D)
    assert out.next_state.shape == (B,)
    assert out.rollout_extras is None
    assert jnp.ndim(out.regularization_loss) == 0
    assert not np.array_equal(_kd(out.next_state), _kd(state))


@pytest.mark.parametrize("kind", KINDS)
def test_same_carry_same_input_same_output(kind):
    m = FACTORIES[kind]()
    state = m.initialize_state(B)
    x = _xs()[0]
    a, b = m(state, x), m(state, x)
    np.testing.assert_array_equal(a.output, b.output)
    np.testing.assert_array_equal(_kd(a.next_state), _kd(b.next_state))


@pytest.mark.parametrize("kind", KINDS)
def test_batch_equals_two_halves_over_several_steps(kind):
    m = FACTORIES[kind]()
    state = m.initialize_state(B)
    xs = _xs()
    full_state, full = _run(m, state, xs)
    h = B // 2
    st0, outs0 = _run(m, state[:h], xs[:, :h])
    st1, outs1 = _run(m, state[h:], xs[:, h:])
    for t in range(T):
        np.testing.assert_array_equal(jnp.concatenate([outs0[t], outs1[t]], axis=0), full[t])
    np.testing.assert_array_equal(np.concatenate([_kd(st0), _kd(st1)]), _kd(full_state))


@pytest.mark.parametrize("kind", KINDS)
def test_jit_split_merge_matches_eager(kind):
    m = FACTORIES[kind]()
    graphdef, st = nnx.split(m)

    @jax.jit
    def step(st, carry, x):
        out = nnx.merge(graphdef, st)(carry, x)
        return out.next_state, out.output

    carry_e = carry_j = m.initialize_state(B)
    for x in _xs():
        out = m(carry_e, x)
        carry_e = out.next_state
        carry_j, y = step(st, carry_j, x)
        np.testing.assert_allclose(y, out.output, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_reset_keeps_key_chain_by_default(kind):
    m = FACTORIES[kind]()
    state, _ = _run(m, m.initialize_state(B), _xs())
    np.testing.assert_array_equal(_kd(m.reset_state(state)), _kd(state))


@pytest.mark.parametrize("kind", KINDS)
def test_fresh_keys_on_reset(kind):
    m = FACTORIES[kind](fresh_keys_on_reset=True)
    state, _ = _run(m, m.initialize_state(B), _xs())
    fresh = m.reset_state(state)
    assert fresh.shape == (B,)
    assert not np.array_equal(_kd(fresh), _kd(state))
    assert not np.array_equal(_kd(m.reset_state(state)), _kd(fresh))
    # per-env reset as the trainer does it
    mixed = select_where(jnp.array([True, False, False, True]), fresh, state)
    np.testing.assert_array_equal(_kd(mixed)[0], _kd(fresh)[0])
    np.testing.assert_array_equal(_kd(mixed)[1], _kd(state)[1])


@pytest.mark.parametrize("kind", KINDS)
def test_eval_turns_noise_off(kind):
    m = FACTORIES[kind]()
    assert m.deterministic is False
    m.eval()
    assert m.deterministic is True
    x = _xs()[0]
    y = m(m.initialize_state(B), x).output
    if kind.startswith("gate"):
        np.testing.assert_array_equal(y, (jax.nn.sigmoid(x) > 0.5).astype(jnp.float32))
    else:
        np.testing.assert_array_equal(y, x)
    m.train()
    assert m.deterministic is False


def test_gaussian_noise_statistics_and_identity_at_zero():
    m = GaussianNoise(0.5, nnx.Rngs(1))
    x = jnp.ones((8, 256))
    y = m(m.initialize_state(8), x).output
    noise = np.asarray(y - x)
    assert abs(noise.mean()) < 0.05 and abs(noise.std() - 0.5) < 0.05
    z = GaussianNoise(0.0, nnx.Rngs(1))
    np.testing.assert_array_equal(z(z.initialize_state(2), jnp.ones((2, 3))).output, 1.0)


def test_dropout_values_and_rate():
    m = DropoutMask(0.25, nnx.Rngs(1))
    x = jnp.ones((8, 256))
    y = np.asarray(m(m.initialize_state(8), x).output)
    assert set(np.unique(y).tolist()) <= {0.0, float(np.float32(1.0) / np.float32(0.75))}
    assert abs((y == 0).mean() - 0.25) < 0.05
    r0 = DropoutMask(0.0, nnx.Rngs(1))
    np.testing.assert_array_equal(r0(r0.initialize_state(2), jnp.ones((2, 3))).output, 1.0)


def test_bernoulli_gate_values_probability_and_straight_through_gradient():
    m = BernoulliGate(nnx.Rngs(1))
    state = m.initialize_state(8)
    logits = jnp.full((8, 256), 1.0)
    out = m(state, logits)
    g = np.asarray(out.output)
    assert set(np.unique(g).tolist()) <= {0.0, 1.0}
    p = float(jax.nn.sigmoid(1.0))
    assert abs(g.mean() - p) < 0.05
    np.testing.assert_allclose(out.metrics["gate_open_fraction"], g.mean())
    x = _xs(1, 8)[0]
    grad = jax.grad(lambda v: m(state, v).output.sum())(x)
    s = jax.nn.sigmoid(x)
    np.testing.assert_allclose(grad, s * (1 - s), rtol=1e-5)


def test_bernoulli_gate_gumbel_estimator_gradient_is_finite_and_nonzero():
    m = BernoulliGate(nnx.Rngs(1), estimator="gumbel_straight_through", temperature=0.5)
    state = m.initialize_state(B)
    x = _xs()[0]
    grad = jax.grad(lambda v: m(state, v).output.sum())(x)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.abs(grad).sum()) > 0
    # hard values are still 0/1 and identical to the straight-through gate's sample
    st = BernoulliGate(nnx.Rngs(1))
    np.testing.assert_array_equal(m(state, x).output, st(state, x).output)


def test_argument_validation():
    with pytest.raises(ValueError, match="GaussianNoise: stddev"):
        GaussianNoise(-0.1, nnx.Rngs(0))
    with pytest.raises(ValueError, match="DropoutMask: rate"):
        DropoutMask(1.0, nnx.Rngs(0))
    with pytest.raises(ValueError, match="DropoutMask: rate"):
        DropoutMask(-0.1, nnx.Rngs(0))
    with pytest.raises(ValueError, match="BernoulliGate: temperature"):
        BernoulliGate(nnx.Rngs(0), temperature=0.0)
    with pytest.raises(ValueError, match="BernoulliGate: estimator"):
        BernoulliGate(nnx.Rngs(0), estimator="reinforce")
    m = GaussianNoise(0.1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"GaussianNoise: state has shape \(3,\), expected \(4,\)"):
        m(m.initialize_state(3), jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match="GaussianNoise: state must be a typed PRNG key"):
        m(jnp.zeros((4,)), jnp.zeros((4, 2)))
