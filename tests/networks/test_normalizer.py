"""Tests for nnx_ppo.networks.normalizer.Normalizer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.normalizer import Normalizer, NormalizerStatistics


def test_before_any_data_inputs_are_divided_by_10_and_emitted():
    """As in the original: standard deviation 10 until the first update."""
    n = Normalizer(3)
    x = jnp.arange(6.0).reshape(2, 3)
    out = n((), x)
    assert out.next_state == ()
    np.testing.assert_allclose(out.output, x / 10.0, rtol=1e-6)
    np.testing.assert_array_equal(out.rollout_extras, x)
    np.testing.assert_array_equal(n.running_mean, 0.0)
    np.testing.assert_array_equal(n.running_variance, 100.0)
    assert n.initialize_state(4) == ()
    assert n.reset_state(()) == ()


def test_statistics_match_numpy_after_several_updates():
    n = Normalizer(3)
    rng = np.random.default_rng(0)
    chunks = [rng.normal(5.0, 3.0, size=(t, 2, 3)).astype(np.float32) for t in (4, 1, 3)]
    for c in chunks:
        n.update_statistics(jnp.asarray(c))
    data = np.concatenate([c.reshape(-1, 3) for c in chunks])
    np.testing.assert_allclose(n.running_mean, data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(n.running_variance, data.var(0), rtol=1e-4)
    assert float(n.counter[...]) == data.shape[0]
    x = jnp.asarray(rng.normal(size=(2, 3)), jnp.float32)
    expected = (np.asarray(x) - data.mean(0)) / np.sqrt(data.var(0) + 1e-8)
    np.testing.assert_allclose(n((), x).output, expected, rtol=1e-4, atol=1e-5)


def test_numerically_stable_with_large_offset():
    n = Normalizer(())
    rng = np.random.default_rng(1)
    chunks = [(1e4 + rng.normal(0.0, 0.01, size=(8, 4))).astype(np.float32) for _ in range(5)]
    for c in chunks:
        n.update_statistics(jnp.asarray(c))
    data = np.concatenate([c.reshape(-1) for c in chunks]).astype(np.float64)
    np.testing.assert_allclose(n.running_mean, data.mean(), rtol=1e-6)
    np.testing.assert_allclose(n.running_variance, data.var(), rtol=2e-2)


def test_pytree_shapes():
    shape = {"a": 2, "b": (2, 3), "c": ()}
    n = Normalizer(shape)
    rng = np.random.default_rng(2)
    extras = [{"a": rng.normal(1.0, 2.0, (3, 2, 2)), "b": rng.normal(-1.0, 0.5, (3, 2, 2, 3)),
               "c": rng.normal(0.0, 4.0, (3, 2))} for _ in range(2)]
    for e in extras:
        n.update_statistics(jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), e))
    mean, var = n.running_mean, n.running_variance
    for key, s in (("a", (2,)), ("b", (2, 3)), ("c", ())):
        data = np.concatenate([e[key].reshape((-1,) + s) for e in extras])
        assert mean[key].shape == s
        np.testing.assert_allclose(mean[key], data.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(var[key], data.var(0), rtol=1e-4)
    x = {"a": jnp.ones((2, 2)), "b": jnp.ones((2, 2, 3)), "c": jnp.ones((2,))}
    out = n((), x)
    assert jax.tree.map(jnp.shape, out.output) == jax.tree.map(jnp.shape, x)
    assert out.rollout_extras is x


def test_clip():
    n = Normalizer(2, clip=1.5)
    y = n((), jnp.array([[100.0, -100.0]])).output  # divided by 10 before any data, then clipped
    np.testing.assert_allclose(y, [[1.5, -1.5]])


def test_statistics_are_not_params_but_are_in_state():
    n = Normalizer({"a": 2, "b": 3})
    assert len(jax.tree.leaves(nnx.state(n, nnx.Param))) == 0
    stats = nnx.state(n, NormalizerStatistics)
    assert len(jax.tree.leaves(stats)) == 1 + 2 * 2  # counter + mean/M2 per leaf
    assert all(isinstance(v, NormalizerStatistics) for v in (n.counter, n.mean, n.M2))


def test_statistics_have_the_original_names_and_layout():
    """``counter``, ``mean``, ``M2``: one variable each; mean and M2 hold an
    array of ``shape``, or a pytree with the structure of ``shape``."""
    n = Normalizer((5, 3))
    assert n.mean.get_value().shape == n.M2.get_value().shape == (5, 3)
    assert float(n.counter.get_value()) == 0.0
    d = Normalizer({"goal": 4, "joints": 8})
    assert {k: v.shape for k, v in d.mean.get_value().items()} == {"goal": (4,), "joints": (8,)}
    d.update_statistics({"goal": jnp.ones((2, 3, 4)), "joints": jnp.zeros((2, 3, 8))})
    assert float(d.counter[...]) == 6.0
    np.testing.assert_allclose(d.mean.get_value()["goal"], 1.0)
    np.testing.assert_allclose(d.M2.get_value()["goal"], 0.0)


def test_call_does_not_write_statistics():
    n = Normalizer(2)
    before = jax.tree.leaves(nnx.state(n))
    n((), jnp.ones((3, 2)) * 7)
    for a, b in zip(before, jax.tree.leaves(nnx.state(n))):
        np.testing.assert_array_equal(a, b)


def test_update_statistics_under_jit_split_merge():
    eager = Normalizer(3)
    jitted = Normalizer(3)
    graphdef, st = nnx.split(jitted)

    @jax.jit
    def update(st, extras):
        m = nnx.merge(graphdef, st)
        m.update_statistics(extras)
        return nnx.state(m)

    @jax.jit
    def apply(st, x):
        return nnx.merge(graphdef, st)((), x).output

    rng = np.random.default_rng(3)
    for _ in range(2):
        e = jnp.asarray(rng.normal(2.0, 1.5, (3, 2, 3)), jnp.float32)
        eager.update_statistics(e)
        st = update(st, e)
    x = jnp.ones((2, 3))
    np.testing.assert_allclose(apply(st, x), eager((), x).output, rtol=1e-5)


def test_update_statistics_none_is_noop():
    n = Normalizer(2)
    n.update_statistics(None)
    assert float(n.counter[...]) == 0.0


def test_shape_errors():
    n = Normalizer(3)
    with pytest.raises(ValueError, match=r"Normalizer: x has shape \(2, 4\), expected \(B, 3\)"):
        n((), jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"Normalizer: rollout_extras has shape \(2, 3\), expected \(T, B, 3\)"):
        n.update_statistics(jnp.zeros((2, 3)))
    d = Normalizer({"a": 2})
    with pytest.raises(ValueError, match="Normalizer: x has tree structure"):
        d((), jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="Normalizer: shape"):
        Normalizer("abc")
    with pytest.raises(ValueError, match="Normalizer: clip"):
        Normalizer(2, clip=0.0)
