"""Ordinary user code of the original nnx-ppo 0.3.0 that must work here
(issue 37): argument and attribute names, output shapes, public names,
output-neutral variable writes, parameter paths, graph building and error
types. Each test names what the original did."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import NetworkFn, ReplayMismatchError, copy_leaf
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.networks import (
    LSTM,
    AR1VariationalBottleneck,
    CategoricalSampler,
    Dense,
    Flattener,
    GaussianNoise,
    Map,
    Merge,
    NormalSampler,
    NormalTanhSampler,
    PPOAdapter,
    Scale,
    Sequential,
    VariationalBottleneck,
    make_mlp_actor_critic,
)
from nnx_ppo.networks.graph import PopulationGraph
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import check_replay_consistency
from tests.algorithms.toy_envs import Target

# --- 1. the RNG argument keeps the original's name -------------------------


@pytest.mark.parametrize("cls", [NormalTanhSampler, NormalSampler, CategoricalSampler])
def test_samplers_take_rng_and_keep_it_as_rng(cls):
    """Original: ``NormalTanhSampler(rng=rngs, entropy_weight=...)``, read back as ``.rng``."""
    rngs = nnx.Rngs(0)
    sampler = cls(rng=rngs, entropy_weight=0.01)
    assert sampler.rng is rngs and sampler.entropy_weight == 0.01
    assert ("rng", "default", "count") in {tuple(p) for p, _ in nnx.to_flat_state(nnx.state(sampler))}
    x = jnp.zeros((3, 4))
    out = sampler((), x)
    assert out.output["log_likelihood"].shape == (3,)


def test_every_rng_argument_is_named_as_in_the_original():
    """The original calls the argument ``rngs`` where it only initializes
    parameters and ``rng`` where the module samples from it."""
    expected = {Dense: "rngs", LSTM: "rngs", PopulationGraph: "rngs", make_mlp_actor_critic: "rngs",
                VariationalBottleneck: "rng", AR1VariationalBottleneck: "rng",
                NormalTanhSampler: "rng", NormalSampler: "rng", CategoricalSampler: "rng"}
    wrong = [f"{factory.__name__} has no {name!r}" for factory, name in expected.items()
             if name not in inspect.signature(factory.__init__ if isinstance(factory, type) else factory).parameters]
    assert not wrong, wrong


# --- 2. a graph always outputs a dict ----------------------------------------


def test_single_output_graph_returns_a_dict_under_its_name():
    """Original: ``{output_to or name: [B, size]}`` even for one output."""
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("a", 3)
    g.add_output("o", 2)
    g.connect("a", "o")
    g.finalize()
    out = g(g.initialize_state(4), jnp.ones((4, 3)))
    assert isinstance(out.output, dict) and set(out.output) == {"o"}
    assert out.output["o"].shape == (4, 2)

    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("a", 3, input_from="x")
    g.add_output("o", 2, output_to="motor")
    g.connect("a", "o")
    g.finalize()
    assert set(g(g.initialize_state(4), {"x": jnp.ones((4, 3))}).output) == {"motor"}


# --- 3. JaxDataclass and ModuleState ------------------------------------------


def test_jax_dataclass_is_a_pytree_rebuilt_without_init():
    """Original: a mixin for frozen dataclasses registered with
    ``register_pytree_node_class``; ``replace``; unflattening skips ``__init__``."""
    from nnx_ppo.jax_dataclass import JaxDataclass

    built = []

    @jax.tree_util.register_pytree_node_class
    @dataclasses.dataclass(frozen=True)
    class Step(JaxDataclass):
        obs: jax.Array
        reward: jax.Array

        def __post_init__(self):
            built.append(self)

    step = Step(jnp.ones((2, 3)), jnp.zeros(2))
    assert len(built) == 1
    doubled = jax.jit(lambda s: jax.tree.map(lambda v: 2 * v, s))(step)
    assert isinstance(doubled, Step) and len(built) == 1
    np.testing.assert_array_equal(doubled.obs, 2.0)
    assert jax.tree.leaves(jax.tree.map(lambda v: v.shape, step)) == [2, 3, 2]
    changed = step.replace(reward=jnp.ones(2))
    np.testing.assert_array_equal(changed.reward, 1.0) and np.testing.assert_array_equal(step.reward, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.obs = None

    @jax.tree_util.register_pytree_with_keys_class
    @dataclasses.dataclass(frozen=True)
    class Keyed(JaxDataclass):
        a: jax.Array

    [(path, _)] = jax.tree_util.tree_flatten_with_path(Keyed(jnp.zeros(1)))[0]
    assert jax.tree_util.keystr(path) == ".a"


def test_module_outputs_are_jax_dataclasses_with_replace():
    from nnx_ppo.jax_dataclass import JaxDataclass

    out = StatefulModuleOutput(next_state=(), output=jnp.zeros(2))
    assert isinstance(out, JaxDataclass)
    assert out.replace(output=jnp.ones(2)).output.tolist() == [1.0, 1.0]
    assert isinstance(PPONetworkOutput(actions=0, loglikelihoods=0, value_estimates=0), JaxDataclass)


class _CounterNet(StatefulModule):
    """The original's dummy counter network: counts the steps since reset in
    its carry (a dict annotated ``ModuleState``)."""

    def initialize_state(self, batch_size):
        from nnx_ppo.networks.types import ModuleState

        state: ModuleState = {"counter_state": {"counter": jnp.zeros(batch_size, jnp.int32)}}
        return state

    def __call__(self, state, obs, rollout_extras=None):
        counter = state["counter_state"]["counter"] + 1
        return StatefulModuleOutput(next_state={"counter_state": {"counter": counter}},
                                    output=counter.astype(jnp.float32)[:, None])


def test_module_state_is_the_carry_type():
    from nnx_ppo.networks import types

    assert "ModuleState" in types.__all__
    net = _CounterNet()
    state = net.initialize_state(2)
    for _ in range(3):
        state = net(state, jnp.zeros((2, 1))).next_state
    assert state["counter_state"]["counter"].tolist() == [3, 3]


# --- 4. writes in __call__ that do not change the output -----------------------


class Count(nnx.Variable):
    pass


class CallCounter(StatefulModule):
    """The original's ``RepeatAndCountNet`` pattern: identity that counts the
    env-steps it has seen in a variable (``start`` a plain int or an array)."""

    def __init__(self, start):
        self.n_calls = Count(start)

    def __call__(self, state, x, rollout_extras=None):
        self.n_calls.set_value(self.n_calls.get_value() + x.shape[0])
        return StatefulModuleOutput(next_state=state, output=x)


class WriteThenRead(StatefulModule):
    """Writes a variable and reads it back in the same call: the output does
    not depend on what the rollout left there."""

    def __init__(self):
        self.gain = nnx.Variable(jnp.zeros(()))

    def __call__(self, state, x, rollout_extras=None):
        self.gain[...] = jnp.float32(2.0)
        return StatefulModuleOutput(next_state=state, output=x * self.gain[...] - x)


class CountIntoOutput(StatefulModule):
    """Breaks the rule: a counter that the output adds, so the loss replay
    (starting where the rollout left the counter) computes something else."""

    def __init__(self):
        self.count = nnx.Variable(jnp.zeros(()))

    def __call__(self, state, x, rollout_extras=None):
        out = x + self.count[...]
        self.count[...] = self.count[...] + 1.0
        return StatefulModuleOutput(next_state=state, output=out)


def _ppo_net(middle):
    rngs = nnx.Rngs(0)
    return Sequential([Dense(3, 8, rngs), middle,
                       PPOAdapter(action=Sequential([Dense(8, 4, rngs), NormalTanhSampler(rngs)]),
                                  value=Dense(8, 1, rngs))])


_TINY = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=4, total_steps=2 * 64),
                    eval=EvalConfig(enabled=False))


def test_int_call_counter_trains_and_counts_the_rollout_steps():
    """Original: ``Count(0)`` with ``+= batch_size`` in ``__call__``; here it
    failed in ``copy_leaf`` (a plain int has no dtype). Rollout writes are
    kept: the counter ends at the number of env-steps trained."""
    net = _ppo_net(CallCounter(0))
    assert check_replay_consistency(net, Target(max_steps=5), n_envs=8, rollout_length=8).passed
    assert net.layers[1].n_calls.get_value() == 0  # the checker works on a copy
    result = train_ppo(Target(max_steps=5), net, _TINY)
    assert int(net.layers[1].n_calls.get_value()) == result.total_steps == 2 * 64


def test_output_neutral_writes_pass_the_replay_check():
    """With an array counter, and with a variable written before it is read,
    the loss replay reproduces the rollout (here: ReplayMismatchError)."""
    env = Target(max_steps=5)
    for middle in (CallCounter(jnp.zeros((), jnp.int32)), WriteThenRead()):
        report = check_replay_consistency(_ppo_net(middle), env, n_envs=8, rollout_length=8, n_minibatches=4)
        assert report.passed, str(report)


class NoiseCountIntoOutput(GaussianNoise):
    """The same rule broken inside a stochastic layer, whose replay scans only
    its key chain and runs the draws for all steps at once."""

    def __init__(self, rngs):
        super().__init__(0.1, rngs)
        self.count = nnx.Variable(jnp.zeros(()))

    def _transform(self, x, sample_keys):
        out, metrics = super()._transform(x, sample_keys)
        self.count[...] = self.count[...] + 1.0
        return out + self.count[...], metrics


@pytest.mark.parametrize("middle", [CountIntoOutput, NoiseCountIntoOutput])
def test_a_write_that_changes_the_output_is_still_refused(middle):
    net = _ppo_net(middle() if middle is CountIntoOutput else middle(nnx.Rngs(1)))
    named = rf"module layers/1 \({middle.__name__}\) mutates an NNX variable \(count\)"
    with pytest.raises(ReplayMismatchError, match=named):
        check_replay_consistency(net, Target(max_steps=5), n_envs=8, rollout_length=8, n_minibatches=4)
    with pytest.raises(ReplayMismatchError, match=named):
        train_ppo(Target(max_steps=5), net, _TINY)


def test_functional_view_never_writes_into_the_module_it_came_from():
    """A write in ``__call__`` goes into the returned view, not into the
    network or the view it was called on."""
    counter = CallCounter(jnp.zeros((), jnp.int32))
    view = NetworkFn.of(counter)
    _, after = view.apply((), jnp.ones((5, 2)))
    assert int(counter.n_calls[...]) == 0
    assert int(view.module().n_calls[...]) == 0 and int(after.module().n_calls[...]) == 5
    assert copy_leaf(3).shape == () and int(copy_leaf(3)) == 3


# --- 5. Dense keeps its parameters in an nnx.Linear ----------------------------


def test_dense_wraps_an_nnx_linear_like_the_original():
    """Original: ``Dense.linear = nnx.Linear(in, out, rngs=rngs)``; parameter
    paths ``linear/kernel`` and ``linear/bias``."""
    d = Dense(3, 4, nnx.Rngs(0))
    assert isinstance(d.linear, nnx.Linear)
    assert (d.linear.in_features, d.linear.out_features) == (3, 4) == (d.in_features, d.out_features)
    paths = {tuple(path) for path, _ in nnx.to_flat_state(nnx.state(d))}
    assert paths == {("linear", "kernel"), ("linear", "bias")}
    assert d.kernel is d.linear.kernel and d.bias is d.linear.bias
    # the same first draw as the original's nnx.Linear with its default init
    np.testing.assert_array_equal(d.linear.kernel[...], nnx.Linear(3, 4, rngs=nnx.Rngs(0)).kernel[...])
    x = jax.random.normal(jax.random.key(0), (2, 3))
    np.testing.assert_allclose(d((), x).output, d.linear(x), rtol=1e-6)
    assert Dense(3, 4, nnx.Rngs(0), use_bias=False).linear.bias is None


def test_factory_networks_have_the_original_parameter_paths():
    net = make_mlp_actor_critic(3, 2, [8], [8], nnx.Rngs(0))
    leaves = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(net, nnx.Param))]
    assert leaves and all(p.endswith(("linear/kernel", "linear/bias")) for p in leaves), leaves


# --- 6. PopulationGraph: early errors, no required input/output, introspection --


def test_graph_mistakes_raise_at_the_build_call():
    """Original: ValueError from ``add_*`` and ``connect``, not from ``finalize``."""
    g = PopulationGraph(nnx.Rngs(0))
    g.add_population("a", 3)
    with pytest.raises(ValueError, match="duplicate population name 'a'"):
        g.add_population("a", 3)
    with pytest.raises(ValueError, match="duplicate population name 'a'"):
        g.add_output("a", 3)
    with pytest.raises(ValueError, match="unknown target population 'missing'"):
        g.connect("a", "missing")
    with pytest.raises(ValueError, match="unknown source population 'missing'"):
        g.connect("missing", "a")
    with pytest.raises(ValueError):
        g.connect("a", "a", delay=-1)


def test_graph_without_input_or_output_is_accepted():
    """The original's own tests: one population and ``finalize()``; a graph
    whose only population loops on itself with a delay."""
    g = PopulationGraph(nnx.Rngs(0))
    g.add_population("a", 2)
    g.finalize()
    with pytest.raises(RuntimeError):
        g.add_population("b", 2)
    out = g(g.initialize_state(3), {"anything": jnp.zeros((3, 5))})
    assert out.output == {}

    g = PopulationGraph(nnx.Rngs(0))
    g.add_population("a", 2, activation=None)
    g.connect("a", "a", delay=1, transform=Scale(0.5))
    g.add_output("o", 2)
    g.connect("a", "o", transform=Scale(1.0))
    g.finalize()
    assert g.populations["a"].max_outgoing_delay == 1
    out = g(g.initialize_state(3), jnp.zeros((3, 1)))  # x only gives the batch size
    np.testing.assert_array_equal(out.output["o"], np.zeros((3, 2)))


def test_graph_exposes_populations_and_connections():
    g = PopulationGraph(nnx.Rngs(0))
    g.add_input("a", 4, input_from="obs")
    g.add_population("h", 3)
    g.add_output("b", 2)
    g.connect("a", "h")
    g.connect("h", "h", delay=2, transform=Scale(0.5))
    g.connect("h", "b")
    assert list(g.populations) == ["a", "h", "b"]
    a, h, b = g.populations.values()
    assert (a.size, a.input_from, a.output_to, a.kind) == (4, "obs", None, "input")
    assert (h.max_outgoing_delay, b.output_to, b.max_outgoing_delay) == (2, "b", 0)
    assert [(c.src, c.dst, c.delay) for c in g.connections] == [("a", "h", 0), ("h", "h", 2), ("h", "b", 0)]
    assert g.connections[0].transform is None  # the default Dense is built at finalize()
    g.finalize()
    first = g.connections[0].transform
    assert isinstance(first, Dense) and (first.in_features, first.out_features) == (4, 3)
    assert first is g.transforms["a->h"] and g.connections[0].name == "a->h"
    with pytest.raises(TypeError):
        g.populations["new"] = None


# --- 7. the original's exception types ---------------------------------------


def test_map_missing_key_is_a_key_error():
    """Original: ``x[name]`` raised KeyError; still a ValueError as documented here."""
    m = Map(a=Scale(1.0), b=Scale(2.0))
    with pytest.raises(KeyError, match=r"Map: x is missing keys \['b'\]") as info:
        m(m.initialize_state(2), {"a": jnp.zeros((2, 1))})
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("Map: x is missing keys")


def test_merge_child_without_dict_output_is_a_type_error():
    merge = Merge(plain=Scale(1.0))
    with pytest.raises(TypeError, match="Merge: child 'plain' must output a dict, got") as info:
        merge(merge.initialize_state(2), jnp.zeros((2, 3)))
    assert isinstance(info.value, ValueError)


def test_flattener_preserving_more_levels_than_the_input_has_is_a_type_error():
    with pytest.raises(TypeError, match="preserve_levels=2"):
        Flattener(preserve_levels=2)((), {"a": jnp.zeros((2, 3))})
    with pytest.raises(TypeError, match="preserve_levels=1"):
        Flattener(preserve_levels=1)((), jnp.zeros((2, 3)))
    out = Flattener(preserve_levels=2)((), {"a": {"p": jnp.zeros((2, 3, 2))}, "b": [jnp.zeros((2, 1))]}).output
    assert out["a"]["p"].shape == (2, 6) and out["b"][0].shape == (2, 1)


# --- 8. the original's positional fields and defaults ----------------------


def test_outputs_take_the_original_positional_field_order():
    """Original: ``StatefulModuleOutput(next_state, output, regularization_loss,
    metrics[, rollout_extras])`` and ``PPONetworkOutput(actions, loglikelihoods,
    value_estimates)`` positionally; keywords still work."""
    out = StatefulModuleOutput((), jnp.ones(2), 0.5, {"m": 1.0}, "extra")
    assert out == StatefulModuleOutput(next_state=(), output=out.output, regularization_loss=0.5,
                                       metrics={"m": 1.0}, rollout_extras="extra")
    assert (out.regularization_loss, out.metrics, out.rollout_extras) == (0.5, {"m": 1.0}, "extra")
    assert StatefulModuleOutput((), 1).regularization_loss == 0.0
    ppo = PPONetworkOutput(jnp.zeros(2), jnp.ones(2), jnp.full(2, 2.0))
    assert [float(v[0]) for v in (ppo.actions, ppo.loglikelihoods, ppo.value_estimates)] == [0.0, 1.0, 2.0]
    assert jax.tree.map(lambda v: v + 1, ppo).value_estimates[0] == 3.0


def test_variational_bottleneck_kl_weight_defaults_to_one():
    """Original: ``VariationalBottleneck(latent_size, rng, kl_weight=1.0, min_std=1e-6)``."""
    assert VariationalBottleneck(3, nnx.Rngs(0)).kl_weight == 1.0
    assert AR1VariationalBottleneck(3, nnx.Rngs(0), smoothness_weight=0.1).kl_weight == 1.0
