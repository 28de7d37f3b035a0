"""nnx_ppo.networks.recording: the original's module-level recording
(with_recording, Recorder, extract_activations, ACTIVATION_KEY)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks import LSTM, Dense, Parallel, Sequential
from nnx_ppo.networks.graph import PopulationGraph
from nnx_ppo.networks.recording import ACTIVATION_KEY, Recorder, extract_activations, with_recording
from nnx_ppo.networks.types import ACTIVATION_KEY as TYPES_ACTIVATION_KEY


def _net():
    rngs = nnx.Rngs(0)
    return Sequential([Dense(4, 8, rngs, activation=nnx.relu), Parallel(rnn=LSTM(8, 6, rngs), ff=Dense(8, 3, rngs))])


def test_leaves_are_wrapped_in_a_copy_with_the_same_outputs():
    net = _net()
    rec = with_recording(net)
    assert isinstance(rec.layers[0], Recorder) and isinstance(rec.layers[0].wrapped, Dense)
    assert type(rec.layers[1]) is Parallel and isinstance(rec.layers[1].components["rnn"], Recorder)
    assert not isinstance(net.layers[0], Recorder)
    state = net.initialize_state(2)
    x = jnp.ones((2, 4))
    ref, out = net(state, x), rec(state, x)
    jax.tree.map(np.testing.assert_array_equal, (ref.output, ref.next_state), (out.output, out.next_state))
    acts = extract_activations(out.metrics)
    assert "0/" + ACTIVATION_KEY in out.metrics and ACTIVATION_KEY is TYPES_ACTIVATION_KEY
    np.testing.assert_array_equal(acts[0], net.layers[0](state[0], x).output)
    assert acts[1]["rnn"].shape == (2, 6) and acts[1]["ff"].shape == (2, 3)
    assert extract_activations(ref.metrics) is None


def test_the_copy_shares_the_variables_and_a_second_call_warns():
    net = _net()
    rec = with_recording(net)
    net.layers[0].linear.bias[...] = jnp.full(8, 3.0)
    np.testing.assert_array_equal(rec.layers[0].wrapped.linear.bias[...], 3.0)
    with pytest.warns(UserWarning, match="already holds Recorder"):
        assert with_recording(rec) is rec


def test_extract_activations_reads_nested_and_flat_metrics():
    a, b = jnp.ones((2, 3)), jnp.zeros((2, 4))
    nested = {0: {ACTIVATION_KEY: a, "entropy": 1.0}, 1: {"inner": {ACTIVATION_KEY: b}}, 2: {"kl": 0.5}}
    flat = {f"0/{ACTIVATION_KEY}": a, "0/entropy": 1.0, f"1/inner/{ACTIVATION_KEY}": b, "2/kl": 0.5}
    for metrics in (nested, flat):
        acts = extract_activations(metrics)
        assert set(acts) == {0, 1} and acts[0] is a and acts[1]["inner"] is b
    assert extract_activations({"kl": 1.0}) is None and extract_activations(jnp.ones(2)) is None


def test_a_graph_reports_its_populations_when_recorded():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("in", 4, input_from="in")
    g.add_population("hidden", 5)
    g.add_output("mot", 3)
    g.connect("in", "hidden")
    g.connect("hidden", "mot")
    g.finalize()
    rec = with_recording(Sequential([g]))
    assert rec.layers[0].record_activations and not g.record_activations
    assert not isinstance(rec.layers[0].transforms["in->hidden"], Recorder)  # the graph reports its populations
    x = {"in": jnp.ones((2, 4))}
    out = rec(rec.initialize_state(2), x)
    acts = extract_activations(out.metrics)[0]
    assert {k: v.shape for k, v in acts.items()} == {"in": (2, 4), "hidden": (2, 5), "mot": (2, 3)}
    np.testing.assert_array_equal(acts["mot"], out.output["mot"])
    assert g(g.initialize_state(2), x).metrics == {}



def test_a_recording_copy_replays_exactly():
    """Recorder keeps the replay guarantee: a recording copy of an LSTM
    actor-critic replays its rollout exactly, with resets inside the rollout
    and minibatches."""
    from nnx_ppo.networks.factories import make_recurrent_actor_critic
    from nnx_ppo.testing import check_replay_consistency
    from tests.algorithms.toy_envs import Target

    net = make_recurrent_actor_critic(3, 2, nnx.Rngs(0), hidden_size=8)
    report = check_replay_consistency(with_recording(net), Target(max_steps=5), n_envs=8, rollout_length=12,
                                      n_minibatches=4)
    assert report.n_resets > 0 and report.passed, str(report)
