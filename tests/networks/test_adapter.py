"""Tests for nnx_ppo.networks.adapter (PPOAdapter)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Parallel, Sequential, Splitter
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import Map

B, D = 3, 4


class Record(StatefulModule):
    """Identity that remembers (in a Python list) the inputs it saw."""

    def __init__(self):
        self.seen = []

    def __call__(self, state, x, rollout_extras=None):
        self.seen.append(x)
        return StatefulModuleOutput(next_state=(), output=x)


def _x(seed=0, d=D):
    return jax.random.normal(jax.random.key(seed), (B, d))


def _simple(rngs=None, entropy_weight=0.0):
    rngs = rngs or nnx.Rngs(0)
    return PPOAdapter(action=Sequential(Dense(D, 4, rngs), NormalTanhSampler(rngs, entropy_weight)),
                      value=Dense(D, 1, rngs))


def test_single_sampler_gives_bare_arrays_and_squeezed_value():
    net = _simple()
    out = net(net.initialize_state(B), _x())
    assert isinstance(out.output, PPONetworkOutput)
    assert out.output.actions.shape == (B, 2)
    assert out.output.loglikelihoods.shape == (B,)
    assert out.output.value_estimates.shape == (B,)
    np.testing.assert_allclose(out.output.value_estimates, net.value((), _x()).output[:, 0], rtol=1e-6)


def test_map_of_samplers_gives_dicts_with_the_same_keys():
    rngs = nnx.Rngs(0)
    action = Sequential(Dense(D, 7, rngs), Splitter(arm=4, grip=3),
                        Map(arm=NormalTanhSampler(rngs), grip=CategoricalSampler(rngs)))
    net = PPOAdapter(action=action, value=Dense(D, 1, rngs))
    out = net(net.initialize_state(B), _x())
    assert set(out.output.actions) == {"arm", "grip"}
    assert set(out.output.loglikelihoods) == {"arm", "grip"}
    assert out.output.actions["arm"].shape == (B, 2)
    assert out.output.actions["grip"].shape == (B,) and out.output.actions["grip"].dtype == jnp.int32
    assert out.output.loglikelihoods["arm"].shape == (B,)
    assert out.output.loglikelihoods["grip"].shape == (B,)
    assert out.output.value_estimates.shape == (B,)
    # replay reproduces both log-likelihoods
    replay = net(net.initialize_state(B), _x(), out.rollout_extras)
    for k in ("arm", "grip"):
        np.testing.assert_array_equal(replay.output.actions[k], out.output.actions[k])
        np.testing.assert_allclose(replay.output.loglikelihoods[k], out.output.loglikelihoods[k],
                                   atol=1e-6)


def test_dict_value_heads_and_bare_value():
    rngs = nnx.Rngs(0)
    value = Parallel(task=Dense(D, 1, rngs), bonus=Sequential(Dense(D, 1, rngs), _Squeeze()))
    net = PPOAdapter(action=Sequential(Dense(D, 2, rngs), CategoricalSampler(rngs)), value=value)
    out = net(net.initialize_state(B), _x())
    assert set(out.output.value_estimates) == {"task", "bonus"}
    assert out.output.value_estimates["task"].shape == (B,)
    assert out.output.value_estimates["bonus"].shape == (B,)


class _Squeeze(StatefulModule):
    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=(), output=x[:, 0])


def test_bad_value_shape_is_an_error():
    rngs = nnx.Rngs(0)
    net = PPOAdapter(action=Sequential(Dense(D, 2, rngs), CategoricalSampler(rngs)), value=Dense(D, 2, rngs))
    with pytest.raises(ValueError, match=r"PPOAdapter: the value port output has shape \(3, 2\)"):
        net(net.initialize_state(B), _x())


def test_both_ports_see_the_same_input():
    ra, rv = Record(), Record()
    rngs = nnx.Rngs(0)
    net = PPOAdapter(action=Sequential(ra, Dense(D, 2, rngs), CategoricalSampler(rngs)),
                     value=Sequential(rv, Dense(D, 1, rngs)))
    x = _x(3)
    net(net.initialize_state(B), x)
    assert ra.seen[-1] is x and rv.seen[-1] is x


def test_carry_extras_reset_and_statistics_are_routed_per_port():
    rngs = nnx.Rngs(0)
    norm = Normalizer(D)
    net = PPOAdapter(action=Sequential(LSTM(D, 3, rngs), Dense(3, 4, rngs), NormalTanhSampler(rngs)),
                     value=Sequential(norm, Dense(D, 1, rngs)))
    state = net.initialize_state(B)
    assert set(state) == {"action", "value"}
    assert len(state["action"][0]) == 2 and state["value"] == ((), ())
    xs = [_x(t) for t in range(3)]
    extras = []
    for x in xs:
        out = net(state, x)
        state = out.next_state
        extras.append(out.rollout_extras)
    e = extras[0]
    assert set(e) == {"action", "value"}
    assert e["action"][0] is None and e["action"][2].shape == (B, 2)
    np.testing.assert_array_equal(e["value"][0], xs[0])
    # reset zeroes the LSTM carry
    reset = net.reset_state(state)
    assert float(jnp.abs(state["action"][0][0]).sum()) > 0
    for leaf in jax.tree.leaves(reset):
        np.testing.assert_array_equal(leaf, 0.0)
    # update_statistics reaches the Normalizer in the value port
    stacked = jax.tree.map(lambda *v: jnp.stack(v), *extras)
    net.update_statistics(stacked)
    assert float(norm.counter[...]) == 3 * B
    np.testing.assert_allclose(norm.running_mean, jnp.stack(xs).reshape(-1, D).mean(0), rtol=1e-5,
                               atol=1e-6)


def test_regularization_and_metrics():
    rngs = nnx.Rngs(0)
    sampler = NormalTanhSampler(rngs, entropy_weight=0.1)
    net = PPOAdapter(action=Sequential(Dense(D, 4, rngs), sampler), value=Dense(D, 1, rngs))
    out = net(net.initialize_state(B), _x())
    params = net.action[0]((), _x()).output
    alone = sampler((), params, out.rollout_extras["action"][1])
    np.testing.assert_allclose(out.regularization_loss, alone.regularization_loss, rtol=1e-5)
    assert set(out.metrics) == {"action/1/entropy", "action/1/sigma"}


def test_error_when_action_port_does_not_end_in_samplers():
    rngs = nnx.Rngs(0)
    net = PPOAdapter(action=Dense(D, 2, rngs), value=Dense(D, 1, rngs))
    with pytest.raises(ValueError, match="PPOAdapter: the action port must output a sampler dict"):
        net(net.initialize_state(B), _x())
    with pytest.raises(TypeError, match="PPOAdapter: value must be a StatefulModule"):
        PPOAdapter(action=Dense(D, 2, rngs), value=nnx.Linear(D, 1, rngs=rngs))


def test_adapter_under_jit():
    net = _simple()
    graphdef, st = nnx.split(net)

    @jax.jit
    def step(st, carry, x):
        m = nnx.merge(graphdef, st)
        out = m(carry, x)
        return nnx.state(m), out.output, out.rollout_extras

    st, o, e = step(st, net.initialize_state(B), _x())
    assert o.loglikelihoods.shape == (B,) and o.value_estimates.shape == (B,)
    replay = nnx.merge(graphdef, st)(net.initialize_state(B), _x(), e)
    np.testing.assert_allclose(replay.output.loglikelihoods, o.loglikelihoods, atol=1e-5)
