"""Tests for nnx_ppo.networks.sampling_layers.

Reference log-likelihoods and entropies are computed here with plain numpy
in float64.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import (
    ActionSampler,
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
)

B, A = 4, 2


def _params(seed=0, b=B, a=A):
    return jax.random.normal(jax.random.key(seed), (b, 2 * a))


def _np_std(pre, min_std, std_scale=1.0):
    return (np.log1p(np.exp(pre)) + min_std) * std_scale


def _np_gauss_logpdf(u, mean, std):
    return -0.5 * ((u - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)


def test_samplers_are_action_samplers_with_empty_carry():
    for s in (NormalTanhSampler(nnx.Rngs(0)), NormalSampler(nnx.Rngs(0)), CategoricalSampler(nnx.Rngs(0))):
        assert isinstance(s, ActionSampler)
        assert s.initialize_state(B) == ()
        assert s.deterministic is False


# --- NormalTanhSampler ----------------------------------------------------------


def test_normal_tanh_loglik_matches_numpy_reference():
    s = NormalTanhSampler(nnx.Rngs(0), min_std=0.05)
    x = _params()
    out = s((), x)
    raw = np.asarray(out.rollout_extras, np.float64)
    action = np.asarray(out.output["action"])
    assert raw.shape == (B, A) and action.shape == (B, A)
    assert out.output["log_likelihood"].shape == (B,)
    assert np.all(np.abs(action) < 1.0)
    np.testing.assert_allclose(action, np.tanh(raw), rtol=1e-6)
    xn = np.asarray(x, np.float64)
    mean, std = xn[:, :A], _np_std(xn[:, A:], 0.05)
    expected = np.sum(_np_gauss_logpdf(raw, mean, std) - np.log(1.0 - np.tanh(raw) ** 2), axis=-1)
    np.testing.assert_allclose(out.output["log_likelihood"], expected, rtol=1e-5, atol=1e-5)
    assert out.next_state == ()


def test_normal_tanh_loglik_finite_for_extreme_inputs():
    s = NormalTanhSampler(nnx.Rngs(0))
    x = jnp.concatenate([jnp.full((B, A), 8.0), jnp.full((B, A), 3.0)], axis=-1)
    out = s((), x)
    assert np.all(np.isfinite(out.output["log_likelihood"]))
    # the stable log(1 - tanh^2) agrees with the naive formula where the latter is accurate
    u = jnp.array([[-3.0, 0.5]], jnp.float32)
    lik = NormalTanhSampler(nnx.Rngs(0), min_std=0.0)((), jnp.array([[0.0, 0.0, 0.0, 0.0]]), u)
    std = math.log(2.0)
    ref = np.sum(_np_gauss_logpdf(np.asarray(u, np.float64), 0.0, std)
                 - np.log(1.0 - np.tanh(np.asarray(u, np.float64)) ** 2))
    np.testing.assert_allclose(lik.output["log_likelihood"], [ref], rtol=1e-5)


def test_normal_tanh_replay_reproduces_rollout_exactly():
    s = NormalTanhSampler(nnx.Rngs(1))
    x = _params(1)
    roll = s((), x)
    other = s((), x)  # the next draw differs
    assert not np.allclose(other.rollout_extras, roll.rollout_extras)
    replay = s((), x, roll.rollout_extras)
    np.testing.assert_array_equal(replay.output["action"], roll.output["action"])
    np.testing.assert_array_equal(replay.output["log_likelihood"], roll.output["log_likelihood"])
    np.testing.assert_array_equal(replay.rollout_extras, roll.rollout_extras)


def test_normal_tanh_entropy_bonus():
    w = 0.3
    s = NormalTanhSampler(nnx.Rngs(2), entropy_weight=w, min_std=0.01)
    x = _params(2)
    out = s((), x)
    xn, raw = np.asarray(x, np.float64), np.asarray(out.rollout_extras, np.float64)
    std = _np_std(xn[:, A:], 0.01)
    gauss_entropy = np.sum(0.5 + 0.5 * np.log(2 * np.pi) + np.log(std), axis=-1)
    entropy = gauss_entropy + np.sum(np.log(1.0 - np.tanh(raw) ** 2), axis=-1)
    np.testing.assert_allclose(out.regularization_loss, -w * entropy.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.metrics["entropy"], entropy.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.metrics["sigma"], std.mean(), rtol=1e-5)
    assert float(NormalTanhSampler(nnx.Rngs(2))((), x).regularization_loss) == 0.0
    with pytest.raises(ValueError, match="entropy_weight must be >= 0"):
        NormalTanhSampler(nnx.Rngs(0), entropy_weight=-1.0)


def test_normal_tanh_entropy_bonus_has_a_reparameterized_gradient():
    """The squashing part of the entropy estimate acts on the mean and the
    std (reparameterized with the sample's noise held fixed), so the bonus
    pulls the mean away from tanh's saturated ends; and the replay gives the
    rollout's value."""
    w = 0.5
    s = NormalTanhSampler(nnx.Rngs(3), entropy_weight=w, min_std=0.01)
    x = _params(3) + jnp.concatenate([jnp.full((B, A), 1.5), jnp.zeros((B, A))], axis=-1)
    raw = s((), x).rollout_extras

    def reg(x):
        return s((), x, raw).regularization_loss

    grad = np.asarray(jax.grad(reg)(x), np.float64)
    xn, rawn = np.asarray(x, np.float64), np.asarray(raw, np.float64)
    mean, pre = xn[:, :A], xn[:, A:]
    std = _np_std(pre, 0.01)
    noise = (rawn - mean) / std
    dlogdet_du = -2.0 * np.tanh(rawn)
    expected_mean = -w / B * dlogdet_du
    expected_pre = -w / B * (1.0 / std + dlogdet_du * noise) * (1.0 / (1.0 + np.exp(-pre)))
    np.testing.assert_allclose(grad[:, :A], expected_mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad[:, A:], expected_pre, rtol=1e-4, atol=1e-6)
    assert np.all(grad[:, :A] * np.tanh(rawn) > 0)  # descending the loss moves the mean towards 0
    np.testing.assert_allclose(s((), x, raw).regularization_loss, reg(x), rtol=1e-6)


def test_eval_mode_is_deterministic_and_train_restores_sampling():
    rngs = nnx.Rngs(0)
    net = Sequential(Dense(3, 2 * A, rngs), NormalTanhSampler(rngs))
    obs = jax.random.normal(jax.random.key(5), (B, 3))
    mean = net[0]((), obs).output[:, :A]
    net.eval()
    assert net[1].deterministic is True
    a1 = net(net.initialize_state(B), obs).output["action"]
    a2 = net(net.initialize_state(B), obs).output["action"]
    np.testing.assert_allclose(a1, jnp.tanh(mean), rtol=1e-6)
    np.testing.assert_array_equal(a1, a2)
    net.train()
    assert net[1].deterministic is False
    b1 = net(net.initialize_state(B), obs).output["action"]
    b2 = net(net.initialize_state(B), obs).output["action"]
    assert not np.allclose(b1, b2)
    assert not np.allclose(b1, a1)


def test_sampler_under_jit_with_split_merge_and_rng_advances():
    s = NormalTanhSampler(nnx.Rngs(0))
    graphdef, st = nnx.split(s)

    @jax.jit
    def step(st, x):
        m = nnx.merge(graphdef, st)
        out = m((), x)
        return nnx.state(m), out.output, out.rollout_extras

    x = _params()
    st, o1, e1 = step(st, x)
    st, o2, e2 = step(st, x)
    assert not np.allclose(e1, e2)
    replay = nnx.merge(graphdef, st)((), x, e1)
    np.testing.assert_allclose(replay.output["log_likelihood"], o1["log_likelihood"], atol=1e-5)


# --- NormalSampler -----------------------------------------------------------------


def test_normal_sampler_loglik_and_exact_entropy():
    w = 0.5
    s = NormalSampler(nnx.Rngs(0), entropy_weight=w, min_std=0.1, std_scale=2.0)
    x = _params(3)
    out = s((), x)
    raw = np.asarray(out.rollout_extras, np.float64)
    np.testing.assert_array_equal(out.output["action"], out.rollout_extras)  # unsquashed
    xn = np.asarray(x, np.float64)
    mean, std = xn[:, :A], _np_std(xn[:, A:], 0.1, 2.0)
    np.testing.assert_allclose(out.output["log_likelihood"],
                               _np_gauss_logpdf(raw, mean, std).sum(-1), rtol=1e-5, atol=1e-5)
    entropy = np.sum(0.5 * np.log(2 * np.pi * np.e * std ** 2), axis=-1)
    np.testing.assert_allclose(out.metrics["entropy"], entropy.mean(), rtol=1e-5)
    np.testing.assert_allclose(out.regularization_loss, -w * entropy.mean(), rtol=1e-5)
    replay = s((), x, out.rollout_extras)
    np.testing.assert_array_equal(replay.output["log_likelihood"], out.output["log_likelihood"])
    s.eval()
    np.testing.assert_allclose(s((), x).output["action"], mean, rtol=1e-6)


def test_normal_sampler_sample_mean_and_std():
    n = 4000
    pre = math.log(math.expm1(0.3))  # softplus(pre) = 0.3
    x = jnp.concatenate([jnp.full((n, 1), 0.5), jnp.full((n, 1), pre)], axis=-1)
    samples = np.asarray(NormalSampler(nnx.Rngs(0), min_std=0.0)((), x).output["action"])[:, 0]
    assert abs(samples.mean() - 0.5) < 0.03
    assert abs(samples.std() - 0.3) < 0.03
    # squashed: tanh of the same Gaussian
    squashed = np.asarray(NormalTanhSampler(nnx.Rngs(1), min_std=0.0)((), x).rollout_extras)[:, 0]
    assert abs(squashed.mean() - 0.5) < 0.03 and abs(squashed.std() - 0.3) < 0.03


def test_normal_sampler_input_errors():
    s = NormalSampler(nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"NormalSampler: x has shape \(4, 3\), expected \(B, 2 \* action_size\)"):
        s((), jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"NormalTanhSampler: x has shape \(4,\)"):
        NormalTanhSampler(nnx.Rngs(0))((), jnp.zeros((4,)))
    with pytest.raises(ValueError, match="min_std must be >= 0 and std_scale > 0"):
        NormalSampler(nnx.Rngs(0), std_scale=0.0)


# --- CategoricalSampler ------------------------------------------------------------


def test_categorical_sampler_actions_loglik_and_entropy():
    w = 0.2
    s = CategoricalSampler(nnx.Rngs(0), entropy_weight=w)
    logits = jax.random.normal(jax.random.key(7), (B, 3)) * 2.0
    out = s((), logits)
    action = out.output["action"]
    assert action.shape == (B,) and action.dtype == jnp.int32
    assert np.all((np.asarray(action) >= 0) & (np.asarray(action) < 3))
    ln = np.asarray(logits, np.float64)
    log_probs = ln - np.log(np.exp(ln).sum(-1, keepdims=True))
    np.testing.assert_allclose(out.output["log_likelihood"],
                               log_probs[np.arange(B), np.asarray(action)], rtol=1e-5, atol=1e-6)
    entropy = -(np.exp(log_probs) * log_probs).sum(-1)
    np.testing.assert_allclose(out.regularization_loss, -w * entropy.mean(), rtol=1e-5)
    np.testing.assert_array_equal(out.rollout_extras, action)


def test_categorical_replay_uses_stored_action():
    s = CategoricalSampler(nnx.Rngs(0))
    logits = jax.random.normal(jax.random.key(8), (B, 4))
    stored = jnp.array([3, 0, 2, 1], jnp.int32)
    out = s((), logits, stored)
    np.testing.assert_array_equal(out.output["action"], stored)
    ln = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    np.testing.assert_allclose(out.output["log_likelihood"], ln[np.arange(B), [3, 0, 2, 1]], rtol=1e-6)
    roll = s((), logits)
    replay = s((), logits, roll.rollout_extras)
    np.testing.assert_array_equal(replay.output["log_likelihood"], roll.output["log_likelihood"])


def test_categorical_eval_takes_argmax():
    s = CategoricalSampler(nnx.Rngs(0))
    logits = jax.random.normal(jax.random.key(9), (B, 5))
    s.eval()
    out = s((), logits)
    np.testing.assert_array_equal(out.output["action"], np.argmax(np.asarray(logits), -1))
    assert out.output["action"].dtype == jnp.int32
    s.train()
    assert s.deterministic is False


def test_categorical_sample_frequencies():
    n = 4000
    probs = np.array([0.2, 0.5, 0.3])
    logits = jnp.tile(jnp.log(jnp.asarray(probs, jnp.float32))[None, :], (n, 1))
    actions = np.asarray(CategoricalSampler(nnx.Rngs(0))((), logits).output["action"])
    freq = np.bincount(actions, minlength=3) / n
    np.testing.assert_allclose(freq, probs, atol=0.03)


def test_categorical_input_errors():
    s = CategoricalSampler(nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"CategoricalSampler: x has shape \(4, 1\), expected \(B, n_actions\)"):
        s((), jnp.zeros((4, 1)))
    with pytest.raises(ValueError, match=r"CategoricalSampler: x has shape \(4,\)"):
        s((), jnp.zeros((4,)))
