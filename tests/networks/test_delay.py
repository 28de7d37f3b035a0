"""Tests for nnx_ppo.networks.delay.Delay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.types import select_where

B = 2


def _xs(t_steps, shape=(3,)):
    # x_t = t + 1 (+ env offset) so every step is distinguishable from the zero fill
    return [jnp.full((B,) + shape, float(t + 1)) + jnp.arange(B, dtype=jnp.float32).reshape((B,) + (1,) * len(shape))
            for t in range(t_steps)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_outputs_input_from_k_steps_earlier(k):
    d = Delay(jnp.zeros(3), k)
    state = d.initialize_state(B)
    assert state["buffer"].shape == (B, k, 3)
    assert state["idx"].shape == (B,) and state["idx"].dtype == jnp.int32
    xs = _xs(6)
    for t, x in enumerate(xs):
        out = d(state, x)
        state = out.next_state
        assert out.output.shape == (B, 3)
        expected = xs[t - k] if t >= k else jnp.zeros((B, 3))
        np.testing.assert_array_equal(out.output, expected)
        assert out.rollout_extras is None


def test_zero_delay_is_identity_with_empty_carry():
    d = Delay(jnp.zeros(3), 0)
    assert d.initialize_state(B) == ()
    x = _xs(1)[0]
    out = d((), x)
    assert out.next_state == ()
    np.testing.assert_array_equal(out.output, x)
    assert d.reset_state(()) == ()


def test_pytree_input_and_dtypes():
    sample = {"a": jnp.zeros(2), "b": jnp.zeros((2, 2), jnp.int32)}
    d = Delay(sample, 2)
    state = d.initialize_state(B)
    assert state["buffer"]["a"].shape == (B, 2, 2) and state["buffer"]["b"].shape == (B, 2, 2, 2)
    assert state["buffer"]["b"].dtype == jnp.int32
    xs = [{"a": jnp.full((B, 2), t + 1.0), "b": jnp.full((B, 2, 2), t + 1, jnp.int32)} for t in range(4)]
    outs = []
    for x in xs:
        out = d(state, x)
        state = out.next_state
        outs.append(out.output)
    np.testing.assert_array_equal(outs[0]["a"], 0.0)
    np.testing.assert_array_equal(outs[1]["b"], 0)
    np.testing.assert_array_equal(outs[2]["a"], xs[0]["a"])
    np.testing.assert_array_equal(outs[3]["b"], xs[1]["b"])
    assert outs[3]["b"].dtype == jnp.int32


def test_reset_zeros_buffer_and_restarts_delay():
    k = 2
    d = Delay(jnp.zeros(3), k)
    state = d.initialize_state(B)
    xs = _xs(6)
    for x in xs[:3]:
        state = d(state, x).next_state
    reset = d.reset_state(state)
    np.testing.assert_array_equal(reset["buffer"], 0.0)
    np.testing.assert_array_equal(reset["idx"], 0)
    # reset only env 0, as the trainer does
    state = select_where(jnp.array([True, False]), reset, state)
    outs = []
    for x in xs[3:]:
        out = d(state, x)
        state = out.next_state
        outs.append(out.output)
    # env 0: zeros for k steps after reset, then x from k steps earlier
    np.testing.assert_array_equal(outs[0][0], 0.0)
    np.testing.assert_array_equal(outs[1][0], 0.0)
    np.testing.assert_array_equal(outs[2][0], xs[3][0])
    # env 1 continued: x from k steps earlier
    np.testing.assert_array_equal(outs[0][1], xs[1][1])
    np.testing.assert_array_equal(outs[2][1], xs[3][1])


def test_initial_value_fills_the_buffer_until_it_fills_and_after_a_reset():
    """The original's ``initial_value`` argument."""
    d = Delay({"a": jnp.zeros(2), "n": jnp.zeros((), jnp.int32)}, 2, initial_value=-1.0)
    state = d.initialize_state(B)
    x = {"a": jnp.ones((B, 2)), "n": jnp.full((B,), 7, jnp.int32)}
    outs = []
    for _ in range(3):
        out = d(state, x)
        state = out.next_state
        outs.append(out.output)
    np.testing.assert_array_equal(outs[0]["a"], -1.0)
    assert outs[1]["n"].dtype == jnp.int32 and (outs[1]["n"] == -1).all()
    np.testing.assert_array_equal(outs[2]["a"], 1.0)
    np.testing.assert_array_equal(d.reset_state(state)["buffer"]["a"], -1.0)


def test_a_slice_of_the_carry_steps_as_those_envs_do_in_the_batch():
    """Each env has its own ring position: a minibatch of envs, sliced out of
    the carry after steps whose positions differ by env, continues exactly."""
    d = Delay(jnp.zeros(3), 3)
    state = d.initialize_state(4)
    xs = _xs(5, (3,))[:5]
    xs = [jnp.concatenate([x, x + 10.0]) for x in xs]  # [4, 3]
    for t, x in enumerate(xs[:4]):
        state = d(state, x).next_state
        if t == 1:  # envs 0 and 2 start a new episode: their positions go back to 0
            state = select_where(jnp.array([True, False, True, False]), d.reset_state(state), state)
    whole = d(state, xs[4])
    part = d(jax.tree.map(lambda v: v[1:3], state), xs[4][1:3])
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(lambda v: v[1:3], whole.next_state), part.next_state)
    np.testing.assert_array_equal(whole.output[1:3], part.output)
    np.testing.assert_array_equal(whole.output[1], xs[1][1])  # env 1 continued: 3 steps back
    np.testing.assert_array_equal(whole.output[2], 0.0)  # env 2: the 3rd step of its new episode


def test_shape_errors():
    with pytest.raises(ValueError, match="Delay: k_steps"):
        Delay(jnp.zeros(3), -1)
    d = Delay(jnp.zeros(3), 1)
    with pytest.raises(ValueError, match=r"Delay: x leaf 0 has shape \(2, 4\), expected \(B, 3\)"):
        d(d.initialize_state(2), jnp.zeros((2, 4)))
    d2 = Delay({"a": jnp.zeros(2)}, 1)
    with pytest.raises(ValueError, match="Delay: x has tree structure"):
        d2(d2.initialize_state(2), jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"Delay: state must be the dict"):
        d(jnp.zeros((2, 3, 3)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"Delay: state\['buffer'\] leaf has shape"):
        d({"buffer": jnp.zeros((2, 3, 3)), "idx": jnp.zeros(2, jnp.int32)}, jnp.zeros((2, 3)))


def test_jit_split_merge_matches_eager():
    d = Delay({"a": jnp.zeros(3)}, 2)
    graphdef, st = nnx.split(d)

    @jax.jit
    def step(st, carry, x):
        out = nnx.merge(graphdef, st)(carry, x)
        return out.next_state, out.output

    carry_e = carry_j = d.initialize_state(B)
    for x in _xs(4):
        out = d(carry_e, {"a": x})
        carry_e = out.next_state
        carry_j, y = step(st, carry_j, {"a": x})
        np.testing.assert_array_equal(y["a"], out.output["a"])
