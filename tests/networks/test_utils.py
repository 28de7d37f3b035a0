"""Tests for nnx_ppo.networks.utils (Flattener, Filter, Map, Merge, Scale)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.containers import Parallel, Sequential
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, select_where
from nnx_ppo.networks.utils import Filter, Flattener, Map, Merge, Scale

B = 3


class ConstReg(StatefulModule):
    def __init__(self, value):
        self.value = float(value)

    def __call__(self, state, x, rollout_extras=None):
        v = jnp.asarray(self.value, jnp.float32)
        return StatefulModuleOutput(next_state=(), output=x, regularization_loss=v,
                                    metrics={"reg": v})


def _r(seed, *shape):
    return jax.random.normal(jax.random.key(seed), (B,) + shape)


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


# --- Flattener -------------------------------------------------------------------


def test_flattener_concatenates_leaves_in_tree_order():
    x = {"b": _r(0, 2, 3), "a": _r(1, 4), "c": jnp.ones((B,), jnp.int32)}
    f = Flattener()
    assert f.initialize_state(B) == ()
    out = f((), x)
    assert out.output.shape == (B, 4 + 6 + 1)
    assert out.output.dtype == jnp.float32
    np.testing.assert_array_equal(out.output[:, :4], x["a"])            # keys sorted: a, b, c
    np.testing.assert_array_equal(out.output[:, 4:10], x["b"].reshape(B, 6))
    np.testing.assert_array_equal(out.output[:, 10], 1.0)
    assert out.next_state == () and out.rollout_extras is None
    # a single array is reshaped to [B, F]
    np.testing.assert_array_equal(f((), x["b"]).output, x["b"].reshape(B, 6))


def test_flattener_preserve_levels():
    x = {"a": {"p": _r(0, 4), "q": _r(1, 2)}, "b": _r(2, 3)}
    out = Flattener(preserve_levels=1)((), x).output
    assert set(out) == {"a", "b"}
    assert out["a"].shape == (B, 6) and out["b"].shape == (B, 3)
    np.testing.assert_array_equal(out["a"], jnp.concatenate([x["a"]["p"], x["a"]["q"]], axis=-1))
    # two levels: the inner dict is kept, leaves are reshaped to [B, F]
    x2 = {"a": {"p": _r(3, 2, 2)}, "b": [_r(4, 1, 3), _r(5, 2)]}
    out2 = Flattener(preserve_levels=2)((), x2).output
    assert out2["a"]["p"].shape == (B, 4)
    assert isinstance(out2["b"], list) and [v.shape for v in out2["b"]] == [(B, 3), (B, 2)]
    # levels beyond the tree depth are a TypeError (as in the original)
    with pytest.raises(TypeError, match=r"Flattener: preserve_levels=3 keeps 3 levels .* a leaf \(\w+\) at depth 1"):
        Flattener(preserve_levels=3)((), {"z": _r(6, 2, 2)})
    with pytest.raises(ValueError, match="preserve_levels must be >= 0"):
        Flattener(preserve_levels=-1)
    with pytest.raises(ValueError, match="Flattener: input has no array leaves"):
        Flattener()((), {})


# --- Filter ------------------------------------------------------------------------


def test_filter_keys_paths_and_callables():
    x = {"a": {"b": _r(0, 2), "c": _r(1, 1)}, "d": _r(2, 3), "dropped": _r(3, 5)}
    f = Filter({"d": "d", "ab": ("a", "b"), "sum": lambda t: t["d"].sum(-1)})
    out = f((), x)
    assert list(out.output) == ["d", "ab", "sum"]
    np.testing.assert_array_equal(out.output["d"], x["d"])
    np.testing.assert_array_equal(out.output["ab"], x["a"]["b"])
    np.testing.assert_allclose(out.output["sum"], x["d"].sum(-1))
    assert out.next_state == () and f.initialize_state(B) == ()
    # tuple paths also index lists/tuples
    np.testing.assert_array_equal(Filter({"y": ("l", 1)})((), {"l": [x["d"], x["a"]["c"]]}).output["y"],
                                  x["a"]["c"])


def test_filter_errors():
    x = {"a": {"b": _r(0, 2)}}
    with pytest.raises(ValueError, match=r"Filter: spec\['k'\] path \('missing',\) not found"):
        Filter({"k": "missing"})((), x)
    with pytest.raises(ValueError, match=r"Filter: spec\['k'\] path \('a', 'zz'\) not found"):
        Filter({"k": ("a", "zz")})((), x)
    with pytest.raises(TypeError, match="Filter: spec must be a non-empty dict"):
        Filter({})
    with pytest.raises(TypeError, match="Filter: spec must be a non-empty dict"):
        Filter(["a"])
    with pytest.raises(TypeError, match=r"Filter: spec\['k'\] must be a key, a tuple path or a callable"):
        Filter({"k": 3})


# --- Map ---------------------------------------------------------------------------


def test_map_per_key_dispatch_carry_and_reset():
    rngs = nnx.Rngs(0)
    m = Map(mem=LSTM(2, 3, rngs), lag=Delay(jnp.zeros(4), 1), lin=Dense(4, 2, rngs))
    x = {"mem": _r(0, 2), "lag": _r(1, 4), "lin": _r(2, 4), "ignored": _r(3, 9)}
    state = m.initialize_state(B)
    assert isinstance(state, dict) and set(state) == {"mem", "lag", "lin"}
    out = m(state, x)
    assert set(out.output) == {"mem", "lag", "lin"}
    np.testing.assert_allclose(out.output["lin"], m["lin"]((), x["lin"]).output, rtol=1e-6)
    np.testing.assert_array_equal(out.output["lag"], 0.0)
    assert out.output["mem"].shape == (B, 3)
    s1 = m(out.next_state, x).next_state
    reset = m.reset_state(s1)
    assert set(reset) == {"mem", "lag", "lin"}
    for leaf in jax.tree.leaves(reset):
        np.testing.assert_array_equal(leaf, 0.0)
    done = jnp.array([False, False, True])
    mixed = select_where(done, reset, s1)
    for m_leaf, s_leaf in zip(jax.tree.leaves(mixed), jax.tree.leaves(s1)):
        np.testing.assert_array_equal(m_leaf[2], 0.0)
        np.testing.assert_array_equal(m_leaf[:2], s_leaf[:2])
    with pytest.raises(ValueError, match=r"Map: x is missing keys \['lin'\]"):
        m(state, {"mem": x["mem"], "lag": x["lag"]})
    with pytest.raises(ValueError, match="Map: x must be a dict"):
        m(state, x["lin"])


def test_map_of_samplers_extras_replay_and_regularization():
    rngs = nnx.Rngs(1)
    arm = NormalTanhSampler(rngs, entropy_weight=0.01)
    grip = CategoricalSampler(rngs, entropy_weight=0.1)
    m = Map(arm=arm, grip=grip)
    x = {"arm": _r(0, 4), "grip": _r(1, 3)}
    roll = m(m.initialize_state(B), x)
    assert set(roll.rollout_extras) == {"arm", "grip"}
    assert roll.rollout_extras["arm"].shape == (B, 2)
    assert roll.rollout_extras["grip"].shape == (B,) and roll.rollout_extras["grip"].dtype == jnp.int32
    np.testing.assert_allclose(jnp.tanh(roll.rollout_extras["arm"]), roll.output["arm"]["action"],
                               rtol=1e-6)
    np.testing.assert_array_equal(roll.rollout_extras["grip"], roll.output["grip"]["action"])
    replay = m(m.initialize_state(B), x, roll.rollout_extras)
    for k in ("arm", "grip"):
        np.testing.assert_array_equal(replay.output[k]["action"], roll.output[k]["action"])
        np.testing.assert_allclose(replay.output[k]["log_likelihood"],
                                   roll.output[k]["log_likelihood"], atol=1e-6)
    # the sum of the children's regularization, computed here from the replay
    arm_alone = arm((), x["arm"], roll.rollout_extras["arm"])
    grip_alone = grip((), x["grip"], roll.rollout_extras["grip"])
    np.testing.assert_allclose(replay.regularization_loss,
                               arm_alone.regularization_loss + grip_alone.regularization_loss,
                               rtol=1e-5)
    assert {"arm/entropy", "arm/sigma", "grip/entropy"} == set(roll.metrics)


def test_map_update_statistics_routes_by_key():
    na, nb = Normalizer(2), Normalizer(3)
    m = Map(a=na, b=nb)
    xs = [{"a": _r(t, 2), "b": 5.0 + _r(t + 10, 3)} for t in range(4)]
    extras = [m(m.initialize_state(B), x).rollout_extras for x in xs]
    m.update_statistics(_stack(extras))
    np.testing.assert_allclose(na.running_mean, jnp.stack([x["a"] for x in xs]).reshape(-1, 2).mean(0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nb.running_mean, jnp.stack([x["b"] for x in xs]).reshape(-1, 3).mean(0),
                               rtol=1e-5)


# --- Merge -------------------------------------------------------------------------


def test_merge_runs_children_on_same_input_and_merges_dicts():
    rngs = nnx.Rngs(0)
    mg = Merge(left=Parallel(p=Dense(2, 3, rngs), q=Delay(jnp.zeros(2), 1)),
               right=Filter({"raw": lambda t: t}))
    x = _r(0, 2)
    state = mg.initialize_state(B)
    assert set(state) == {"left", "right"} and set(state["left"]) == {"p", "q"}
    out = mg(state, x)
    assert set(out.output) == {"p", "q", "raw"}
    np.testing.assert_array_equal(out.output["raw"], x)
    np.testing.assert_array_equal(out.output["q"], 0.0)
    np.testing.assert_array_equal(out.next_state["left"]["q"]["buffer"][:, 0], x)
    assert out.rollout_extras == {"left": {"p": None, "q": None}, "right": None}


def test_merge_errors_and_regularization():
    dup = Merge(one=Filter({"a": lambda t: t}), two=Filter({"a": lambda t: t}))
    with pytest.raises(ValueError, match="Merge: key 'a' is produced by more than one child"):
        dup(dup.initialize_state(B), _r(0, 2))
    with pytest.raises(ValueError, match="Merge: child 'plain' must output a dict, got"):
        mg = Merge(plain=ConstReg(0.0))
        mg(mg.initialize_state(B), _r(0, 2))
    mg = Merge(a=Sequential(ConstReg(0.5), Filter({"x": lambda t: t})),
               b=Sequential(ConstReg(0.25), Filter({"y": lambda t: t})))
    out = mg(mg.initialize_state(B), _r(0, 2))
    np.testing.assert_allclose(out.regularization_loss, 0.75)
    assert set(out.metrics) == {"a/0/reg", "b/0/reg"}


# --- Scale ---------------------------------------------------------------------------


def test_scale_multiplies_every_leaf():
    s = Scale(2.5)
    x = {"a": _r(0, 2), "b": _r(1, 1)}
    out = s(s.initialize_state(B), x)
    np.testing.assert_allclose(out.output["a"], 2.5 * x["a"], rtol=1e-6)
    np.testing.assert_allclose(out.output["b"], 2.5 * x["b"], rtol=1e-6)
    assert out.next_state == () and out.rollout_extras is None
    np.testing.assert_allclose(Scale(-1)((), x["a"]).output, -x["a"])


def test_utils_compose_under_jit():
    rngs = nnx.Rngs(0)
    net = Sequential(Filter({"a": "a", "b": ("nested", "b")}), Map(a=Scale(2.0), b=Dense(2, 2, rngs)),
                     Flattener())
    x = {"a": _r(0, 3), "nested": {"b": _r(1, 2)}}
    graphdef, params = nnx.split(net)
    y = jax.jit(lambda p, s, x: nnx.merge(graphdef, p)(s, x).output)(params, net.initialize_state(B), x)
    assert y.shape == (B, 5)
    np.testing.assert_allclose(y, net(net.initialize_state(B), x).output, rtol=1e-5, atol=1e-6)
