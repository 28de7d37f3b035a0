"""Tests for nnx_ppo.networks.graph.PopulationGraph."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.graph import PopulationGraph
from nnx_ppo.networks.noise import GaussianNoise
from nnx_ppo.networks.recurrent import GRU
from nnx_ppo.networks.sampling_layers import NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, select_where
from nnx_ppo.networks.utils import Filter, Flattener, Scale
from nnx_ppo.testing import check_replay_consistency
from tests.algorithms.toy_envs import Target


def _dense(layer, x):
    return x @ layer.kernel[...] + layer.bias[...][None, :]


def _chain():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("a", 3)
    g.add_population("h", 4, activation=jnp.tanh)
    g.add_output("o", 2)
    g.connect("a", "h")
    g.connect("h", "o")
    return g.finalize()


def _loop():
    """a_t = x_t + 0.5 * b_{t-2};  b_t = a_t  (no activations)."""
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("a", 1)
    g.add_output("b", 1)
    g.connect("a", "b", transform=Scale(1.0))
    g.connect("b", "a", delay=2, transform=Scale(0.5))
    return g.finalize()


def _stateful_graph(seed=0):
    """Delays, a recurrent transform and a self-loop; dict output."""
    rngs = nnx.Rngs(seed)
    g = PopulationGraph(rngs)
    g.add_input("obs", 3)
    g.add_population("h", 5)
    g.add_population("ctx", 4, activation=jax.nn.relu)
    g.add_output("out", 2)
    g.add_output("aux", 1, output_to="value")
    g.connect("obs", "h", transform=GRU(3, 5, rngs))
    g.connect("h", "h", delay=1)
    g.connect("h", "ctx")
    g.connect("ctx", "h", delay=3)
    g.connect("h", "out")
    g.connect("ctx", "out", delay=1)
    g.connect("h", "aux")
    return g.finalize()


def _run(g, state, xs, key=None):
    """Step ``g`` over ``xs``; the outputs, or their entry ``key``."""
    outs = []
    for x in xs:
        o = g(state, x)
        state = o.next_state
        outs.append(o.output if key is None else o.output[key])
    return state, outs


def test_delay0_chain_equals_manual_dense():
    g = _chain()
    assert g.order == ("a", "h", "o")
    x = jax.random.normal(jax.random.key(1), (2, 3))
    state = g.initialize_state(2)
    assert state == {"buffers": {}, "transforms": {}}
    out = g(state, x)
    expected = _dense(g.transforms["h->o"], jnp.tanh(_dense(g.transforms["a->h"], x)))
    assert set(out.output) == {"o"}  # a single output is still a dict, keyed by its name
    np.testing.assert_allclose(out.output["o"], expected, rtol=1e-6, atol=1e-6)
    assert out.output["o"].shape == (2, 2)
    assert set(out.rollout_extras) == {"a->h", "h->o"}


def test_delayed_recurrent_loop_by_hand():
    g = _loop()
    state = g.initialize_state(2)
    assert state["buffers"]["b"].shape == (2, 2, 1)
    assert g.order == ("a", "b")
    xs = [jnp.full((2, 1), t + 1.0) + jnp.array([[0.0], [10.0]]) for t in range(6)]
    _, outs = _run(g, state, xs, "b")
    env0 = [1.0, 2.0, 3.5, 5.0, 6.75, 8.5]
    env1 = [11.0, 12.0, 18.5, 20.0, 24.25, 26.0]  # x = 11, 12, 13 + 5.5, 14 + 6, 15 + 9.25, 16 + 10
    np.testing.assert_allclose(np.concatenate(outs, axis=1), np.array([env0, env1]), rtol=1e-6)


def test_reset_zeros_buffers_and_restarts_the_loop():
    g = _loop()
    state = g.initialize_state(2)
    xs = [jnp.full((2, 1), t + 1.0) for t in range(3)]
    state, _ = _run(g, state, xs)
    assert float(jnp.abs(state["buffers"]["b"]).sum()) > 0
    reset = g.reset_state(state)
    np.testing.assert_array_equal(reset["buffers"]["b"], 0.0)
    # reset env 0 only, as the trainer does
    mixed = select_where(jnp.array([True, False]), reset, state)
    _, outs = _run(g, mixed, xs, "b")
    np.testing.assert_allclose([float(o[0, 0]) for o in outs], [1.0, 2.0, 3.5], rtol=1e-6)
    # env 1 continues: b history 1, 2, 3.5 -> b = 1 + 0.5*2, 2 + 0.5*3.5, 3 + 0.5*2
    np.testing.assert_allclose([float(o[1, 0]) for o in outs], [2.0, 3.75, 4.0], rtol=1e-6)


def test_stateful_transforms_are_in_the_carry_and_reset():
    g = _stateful_graph()
    state = g.initialize_state(2)
    assert set(state["transforms"]) == {"obs->h"}
    assert state["transforms"]["obs->h"].shape == (2, 5)
    assert {k: v.shape for k, v in state["buffers"].items()} == {"h": (2, 1, 5), "ctx": (2, 3, 4)}
    assert g.order == ("obs", "h", "ctx", "out", "aux")
    xs = list(jax.random.normal(jax.random.key(0), (2, 2, 3)))
    state, outs = _run(g, state, xs)
    assert set(outs[-1]) == {"out", "value"} and outs[-1]["value"].shape == (2, 1)
    reset = g.reset_state(state)
    assert all(float(jnp.abs(leaf).sum()) == 0 for leaf in jax.tree.leaves(reset))


def test_delay0_cycle_is_rejected_with_names():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("x", 2)
    g.add_population("p", 2)
    g.add_population("q", 2)
    g.add_population("r", 2)
    g.add_output("y", 2)
    g.connect("x", "p")
    g.connect("p", "q")
    g.connect("q", "r")
    g.connect("r", "p")
    g.connect("r", "y")
    with pytest.raises(ValueError, match="p -> q -> r -> p"):
        g.finalize()


def test_self_loop_without_delay_is_rejected():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("x", 2)
    g.add_output("y", 2)
    g.connect("x", "y")
    g.connect("y", "y")
    with pytest.raises(ValueError, match="cycle y -> y"):
        g.finalize()


def _base():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("x", 3)
    g.add_output("y", 4)
    return g


def test_wiring_mistakes_raise_at_the_call_that_makes_them():
    g = _base()
    with pytest.raises(ValueError, match=r"unknown target population 'nope'; known populations: \['x', 'y'\]"):
        g.connect("x", "nope")
    with pytest.raises(ValueError, match="unknown source population 'nope'"):
        g.connect("nope", "y")
    with pytest.raises(ValueError, match="duplicate population name 'x'"):
        g.add_population("x", 2)
    with pytest.raises(ValueError, match="duplicate population name 'y'"):
        g.add_input("y", 4)
    with pytest.raises(ValueError, match="output populations 'y' and 'z' both write output key 'y'"):
        g.add_output("z", 4, output_to="y")
    with pytest.raises(ValueError, match=r"'x->y'.*in_features=2, expected 3"):
        g.connect("x", "y", transform=Dense(2, 4, nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"'x->y'.*out_features=5, expected 4"):
        g.connect("x", "y", transform=Dense(3, 5, nnx.Rngs(0)))
    g.connect("x", "y")
    with pytest.raises(ValueError, match="duplicate connection name 'x->y'; pass name="):
        g.connect("x", "y", delay=1)
    # the failed calls left nothing behind: the graph is the one declared
    assert list(g.populations) == ["x", "y"] and g.connection_names == ("x->y",)
    g.finalize()
    assert set(g(g.initialize_state(2), jnp.zeros((2, 3))).output) == {"y"}

    # a transform of the wrong output size is caught at call time
    g = _base()
    g.connect("x", "y", transform=Scale(2.0))
    g.finalize()
    with pytest.raises(ValueError, match=r"PopulationGraph: connection 'x->y'.*expected \(2, 4\)"):
        g(g.initialize_state(2), jnp.zeros((2, 3)))

    g = _base()
    g.connect("x", "y")
    g.finalize()
    with pytest.raises(ValueError, match=r"PopulationGraph: input population 'x'.*expected \(B, 3\)"):
        g(g.initialize_state(2), jnp.zeros((2, 5)))
    with pytest.raises(ValueError, match="delay of connection .* must be an int >= 0"):
        _base().connect("x", "y", delay=-1)


def test_population_without_incoming_connection_outputs_its_activation_of_zero():
    g = _base()
    g.add_population("lonely", 2, activation=lambda v: v + 1.5)
    g.add_output("bias", 2)
    g.connect("x", "y")
    g.connect("lonely", "bias", transform=Scale(2.0))
    g.finalize()
    out = g(g.initialize_state(3), jnp.zeros((3, 3)))
    np.testing.assert_allclose(out.output["bias"], np.full((3, 2), 3.0))


def test_use_before_finalize_and_build_after_finalize_raise():
    g = _base()
    g.connect("x", "y")
    with pytest.raises(RuntimeError, match="finalize"):
        g.initialize_state(2)
    with pytest.raises(RuntimeError, match="finalize"):
        g({}, jnp.zeros((2, 3)))
    g.finalize()
    with pytest.raises(RuntimeError, match="after finalize"):
        g.add_population("late", 2)
    with pytest.raises(RuntimeError, match="after finalize"):
        g.connect("x", "y", name="again")


def test_multiple_inputs_from_dict_obs():
    g = PopulationGraph(nnx.Rngs(3))
    g.add_input("vision", 2, input_from="img")
    g.add_input("proprio", 3, activation=jnp.tanh)
    g.add_output("motor", 2)
    g.connect("vision", "motor")
    g.connect("proprio", "motor")
    g.connect("motor", "proprio", delay=1)
    g.finalize()
    k1, k2 = jax.random.split(jax.random.key(0))
    obs = {"img": jax.random.normal(k1, (2, 2)), "proprio": jax.random.normal(k2, (2, 3)), "unused": jnp.zeros((2, 7))}
    state = g.initialize_state(2)
    out1 = g(state, obs)
    t = g.transforms
    p1 = jnp.tanh(obs["proprio"])  # delayed motor is zero at t = 0
    m1 = _dense(t["vision->motor"], obs["img"]) + _dense(t["proprio->motor"], p1)
    np.testing.assert_allclose(out1.output["motor"], m1, rtol=1e-5, atol=1e-6)
    out2 = g(out1.next_state, obs)
    p2 = jnp.tanh(obs["proprio"] + _dense(t["motor->proprio"], m1))
    m2 = _dense(t["vision->motor"], obs["img"]) + _dense(t["proprio->motor"], p2)
    np.testing.assert_allclose(out2.output["motor"], m2, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="missing keys"):
        g(state, {"img": obs["img"]})
    with pytest.raises(ValueError, match="2 input populations"):
        g(state, obs["img"])


def test_jit_with_split_merge_matches_eager():
    g = _stateful_graph()
    graphdef, params = nnx.split(g)

    @jax.jit
    def step(params, state, x):
        module = nnx.merge(graphdef, params)
        out = module(state, x)
        return out.next_state, out.output

    xs = list(jax.random.normal(jax.random.key(1), (4, 2, 3)))
    state_eager, outs_eager = _run(g, g.initialize_state(2), xs)
    state = g.initialize_state(2)
    for x, expected in zip(xs, outs_eager):
        state, out = step(params, state, x)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), out, expected)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), state, state_eager)


def test_batch_equals_two_halves():
    g = _stateful_graph(seed=2)
    xs = list(jax.random.normal(jax.random.key(2), (5, 4, 3)))
    _, full = _run(g, g.initialize_state(4), xs)
    _, first = _run(g, g.initialize_state(2), [x[:2] for x in xs])
    _, second = _run(g, g.initialize_state(2), [x[2:] for x in xs])
    for f, a, b in zip(full, first, second):
        joined = jax.tree.map(lambda u, v: jnp.concatenate([u, v], axis=0), a, b)
        jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6), f, joined)


class _Reporting(StatefulModule):
    """Identity with a regularization loss, a metric and extras (for routing)."""

    def __init__(self):
        self.seen = nnx.Variable(jnp.zeros(()))

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=(), output=x, regularization_loss=jnp.float32(0.25),
                                    metrics={"mean": jnp.mean(x)}, rollout_extras={"x": x})

    def update_statistics(self, rollout_extras):
        self.seen[...] = self.seen[...] + rollout_extras["x"].shape[0]


def test_regularization_metrics_and_statistics_routing():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("x", 2)
    g.add_output("y", 2, output_to="act")
    g.connect("x", "y", transform=_Reporting())
    g.connect("x", "y", transform=_Reporting(), name="second", delay=1)
    g.finalize()
    out = g(g.initialize_state(3), jnp.ones((3, 2)))
    assert set(out.output) == {"act"}
    np.testing.assert_allclose(out.regularization_loss, 0.5)
    assert set(out.metrics) == {"x->y/mean", "second/mean"}
    assert set(out.rollout_extras) == {"x->y", "second"}
    stacked = jax.tree.map(lambda v: jnp.stack([v] * 4), out.rollout_extras)
    g.update_statistics(stacked)
    assert float(g.transforms["x->y"].seen[...]) == 4.0 and float(g.transforms["second"].seen[...]) == 4.0


@pytest.mark.parametrize("precision", ["default", "bfloat16"])
def test_graph_in_ppo_network_replays_exactly(precision):
    rngs = nnx.Rngs(0)
    g = PopulationGraph(rngs)
    g.add_input("obs", 3)
    g.add_population("h", 8)
    g.add_population("ctx", 4)
    g.add_output("policy", 4)
    g.add_output("critic", 1, output_to="value")
    g.connect("obs", "h", transform=GRU(3, 8, rngs))
    g.connect("h", "h", delay=1)
    g.connect("h", "ctx", transform=Sequential([Dense(8, 4, rngs), GaussianNoise(0.1, rngs)]))
    g.connect("ctx", "h", delay=2)
    g.connect("h", "policy")
    g.connect("ctx", "policy", delay=1)
    g.connect("h", "critic")
    g.finalize()
    net = Sequential([
        g,
        PPOAdapter(
            action=Sequential([Filter({"p": "policy"}), Flattener(), NormalTanhSampler(rngs)]),
            value=Sequential([Filter({"v": "value"}), Flattener()]),
        ),
    ])
    env = Target(obs_size=3, action_size=2, max_steps=5)
    report = check_replay_consistency(net, env, n_envs=8, rollout_length=12, n_minibatches=4, seed=0,
                                      precision=precision)
    assert report.n_resets > 0
    assert report.passed, str(report)


def test_a_hidden_population_has_no_activation_by_default():
    """As in the original: ``add_population(name, size)`` sums its inputs."""
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("a", 2)
    g.add_population("h", 2)
    g.add_output("o", 2)
    g.connect("a", "h", transform=Scale(3.0))
    g.connect("h", "o", transform=Scale(1.0))
    g.finalize()
    x = jnp.full((1, 2), 2.0)
    np.testing.assert_array_equal(g(g.initialize_state(1), x).output["o"], 6.0)


def test_reciprocal_connects_both_directions():
    """The original's ``connect(..., reciprocal=True)``: ``src->dst`` and
    ``dst->src`` with the same delay, each with its own default Dense."""
    g = PopulationGraph(nnx.Rngs(0))
    g.add_population("a", 3)
    g.add_population("b", 2)
    assert g.connect("a", "b", delay=1, reciprocal=True) == "a->b"
    assert [(c.src, c.dst, c.delay) for c in g.connections] == [("a", "b", 1), ("b", "a", 1)]
    g.finalize()
    assert (g.transforms["b->a"].in_features, g.transforms["b->a"].out_features) == (2, 3)
    with pytest.raises(ValueError, match="reciprocal=True"):
        PopulationGraph(nnx.Rngs(0)).connect("a", "b", transform=Dense(3, 2, nnx.Rngs(0)), reciprocal=True)
