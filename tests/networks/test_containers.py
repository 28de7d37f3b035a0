"""Tests for nnx_ppo.networks.containers (Sequential, Parallel, Concat, Splitter).

Routing of carry / rollout_extras / update_statistics is checked with real
stateful children (LSTM, GRU, Delay, Normalizer, samplers) and with a tiny
``Tag`` module whose replay output reveals which extras it was handed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.containers import Concat, Parallel, Sequential, Splitter
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM
from nnx_ppo.networks.sampling_layers import NormalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, select_where
from nnx_ppo.networks.utils import Flattener, Map, Merge

B, D, H, T = 3, 4, 5, 4


class ConstReg(StatefulModule):
    """Identity with a constant regularization loss and one metric."""

    def __init__(self, value):
        self.value = float(value)

    def __call__(self, state, x, rollout_extras=None):
        v = jnp.asarray(self.value, jnp.float32)
        return StatefulModuleOutput(next_state=(), output=x, regularization_loss=v,
                                    metrics={"reg": v})


class Tag(StatefulModule):
    """Rollout: identity, emits a ``[B]`` array filled with ``tag``.
    Replay: adds the ``[B]`` extras it was handed to its input, so a test
    sees what was routed to it."""

    def __init__(self, tag):
        self.tag = float(tag)

    def __call__(self, state, x, rollout_extras=None):
        b = jax.tree.leaves(x)[0].shape[0]
        if rollout_extras is None:
            return StatefulModuleOutput(next_state=(), output=x,
                                        rollout_extras=jnp.full((b,), self.tag))
        shift = jnp.broadcast_to(
            jnp.reshape(rollout_extras, (b,) + (1,) * (jnp.ndim(x) - 1)), jnp.shape(x))
        return StatefulModuleOutput(next_state=(), output=x + shift,
                                    rollout_extras=rollout_extras)


def _x(seed=0, b=B, d=D):
    return jax.random.normal(jax.random.key(seed), (b, d))


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _run(module, state, xs):
    extras, outs = [], []
    for x in xs:
        out = module(state, x)
        state = out.next_state
        extras.append(out.rollout_extras)
        outs.append(out.output)
    return state, outs, extras


def _nonzero(tree):
    return any(float(jnp.abs(leaf).sum()) > 0 for leaf in jax.tree.leaves(tree))


# --- Sequential -------------------------------------------------------------------


def test_sequential_chains_outputs_and_accepts_list_or_varargs():
    rngs = nnx.Rngs(0)
    d1, d2 = Dense(D, H, rngs), Dense(H, 2, rngs)
    x = _x()
    expected = d2((), d1((), x).output).output
    for seq in (Sequential(d1, d2), Sequential([d1, d2]), Sequential((d1, d2))):
        out = seq(seq.initialize_state(B), x)
        np.testing.assert_allclose(out.output, expected, rtol=1e-6)
        assert len(seq) == 2 and seq[0] is d1 and seq[1] is d2


def test_sequential_carry_is_a_tuple_per_child():
    seq = Sequential(Dense(D, H, nnx.Rngs(0)), LSTM(H, H, nnx.Rngs(1)), Delay(jnp.zeros(H), 2))
    state = seq.initialize_state(B)
    assert isinstance(state, tuple) and len(state) == 3
    assert state[0] == ()
    assert isinstance(state[1], tuple) and state[1][0].shape == (B, H)
    assert state[2]["buffer"].shape == (B, 2, H) and state[2]["idx"].shape == (B,)
    out = seq(state, _x())
    assert isinstance(out.next_state, tuple)
    assert jax.tree.map(jnp.shape, out.next_state) == jax.tree.map(jnp.shape, state)
    assert isinstance(out.rollout_extras, tuple) and out.rollout_extras == (None, None, None)
    # Delay of 2: the first two outputs are zeros, then the LSTM output of step 0
    lstm_only = Sequential(seq[0], seq[1])
    s_ref = lstm_only.initialize_state(B)
    state = seq.initialize_state(B)
    xs = [_x(t) for t in range(3)]
    ys, refs = [], []
    for x in xs:
        o = seq(state, x)
        state, _ = o.next_state, ys.append(o.output)
        r = lstm_only(s_ref, x)
        s_ref, _ = r.next_state, refs.append(r.output)
    np.testing.assert_array_equal(ys[0], 0.0)
    np.testing.assert_array_equal(ys[1], 0.0)
    np.testing.assert_allclose(ys[2], refs[0], rtol=1e-6)


def test_sequential_reset_zeroes_every_child_and_select_where_is_per_env():
    seq = Sequential(LSTM(D, H, nnx.Rngs(0)), Delay(jnp.zeros(H), 2))
    state, _, _ = _run(seq, seq.initialize_state(B), [_x(t) for t in range(3)])
    assert _nonzero(state[0]) and _nonzero(state[1])
    reset = seq.reset_state(state)
    assert isinstance(reset, tuple)
    assert jax.tree.map(jnp.shape, reset) == jax.tree.map(jnp.shape, state)
    for leaf in jax.tree.leaves(reset):
        np.testing.assert_array_equal(leaf, 0.0)
    done = jnp.array([False, True, False])
    mixed = select_where(done, reset, state)
    for m_leaf, s_leaf in zip(jax.tree.leaves(mixed), jax.tree.leaves(state)):
        np.testing.assert_array_equal(m_leaf[1], 0.0)
        np.testing.assert_array_equal(m_leaf[0], s_leaf[0])
        np.testing.assert_array_equal(m_leaf[2], s_leaf[2])


def test_sequential_extras_and_replay_routing():
    seq = Sequential(Tag(1.0), Normalizer(D), Tag(3.0))
    out = seq(seq.initialize_state(B), _x())
    e = out.rollout_extras
    assert isinstance(e, tuple) and len(e) == 3
    np.testing.assert_array_equal(e[0], 1.0)
    np.testing.assert_array_equal(e[1], _x())  # the Normalizer emits its input
    np.testing.assert_array_equal(e[2], 3.0)
    # replay with hand-made extras: each Tag adds what it was handed; the
    # fresh Normalizer in between divides by 10 (no data yet)
    fed = (jnp.full((B,), 7.0), _x() + 7.0, jnp.full((B,), 9.0))
    replay = seq(seq.initialize_state(B), _x(), fed)
    np.testing.assert_allclose(replay.output, (_x() + 7.0) / 10.0 + 9.0, rtol=1e-5)
    assert replay.rollout_extras[2] is fed[2]


def test_sequential_replay_of_sampler_reproduces_loglik():
    rngs = nnx.Rngs(0)
    seq = Sequential(Dense(D, 4, rngs), NormalTanhSampler(rngs))
    x = _x()
    roll = seq(seq.initialize_state(B), x)
    assert roll.rollout_extras[0] is None and roll.rollout_extras[1].shape == (B, 2)
    again = seq(seq.initialize_state(B), x)  # a fresh sample: different actions
    assert not np.allclose(again.output["action"], roll.output["action"])
    replay = seq(seq.initialize_state(B), x, roll.rollout_extras)
    np.testing.assert_array_equal(replay.output["action"], roll.output["action"])
    np.testing.assert_allclose(replay.output["log_likelihood"], roll.output["log_likelihood"],
                               rtol=0, atol=1e-6)


def test_sequential_update_statistics_reaches_nested_normalizer():
    norm = Normalizer(D)
    seq = Sequential(Dense(D, D, nnx.Rngs(0)), Sequential(norm, Dense(D, 2, nnx.Rngs(1))))
    _, _, extras = _run(seq, seq.initialize_state(B), [_x(t) for t in range(T)])
    stacked = _stack(extras)
    inputs = stacked[1][0]
    assert inputs.shape == (T, B, D)
    seq.update_statistics(stacked)
    assert float(norm.counter[...]) == T * B
    np.testing.assert_allclose(norm.running_mean, inputs.reshape(-1, D).mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.running_variance, inputs.reshape(-1, D).var(0), rtol=1e-4,
                               atol=1e-6)


def test_sequential_regularization_and_metrics():
    rngs = nnx.Rngs(0)
    sampler = NormalSampler(rngs, entropy_weight=0.1)
    seq = Sequential(ConstReg(0.5), ConstReg(0.25), sampler)
    x = _x()
    out = seq(seq.initialize_state(B), x)
    alone = sampler((), x)
    np.testing.assert_allclose(out.regularization_loss, 0.75 + alone.regularization_loss, rtol=1e-6)
    assert jnp.ndim(out.regularization_loss) == 0
    assert set(out.metrics) == {"0/reg", "1/reg", "2/entropy", "2/sigma"}
    np.testing.assert_allclose(out.metrics["1/reg"], 0.25)


def test_sequential_errors():
    with pytest.raises(ValueError, match="Sequential: needs at least one layer"):
        Sequential()
    with pytest.raises(ValueError, match="Sequential"):
        Sequential([])
    with pytest.raises(TypeError, match="Sequential: layer 1 must be a StatefulModule, got int"):
        Sequential(ConstReg(0.0), 3)


# --- dict containers -----------------------------------------------------------


def test_parallel_same_input_and_dict_carry():
    rngs = nnx.Rngs(0)
    p = Parallel(lstm=LSTM(D, H, rngs), gru=GRU(D, H, rngs), delay=Delay(jnp.zeros(D), 1))
    state = p.initialize_state(B)
    assert isinstance(state, dict) and set(state) == {"lstm", "gru", "delay"}
    assert state["gru"].shape == (B, H) and state["delay"]["buffer"].shape == (B, 1, D)
    x = _x()
    out = p(state, x)
    assert set(out.output) == {"lstm", "gru", "delay"}
    np.testing.assert_allclose(out.output["lstm"], p["lstm"](state["lstm"], x).output, rtol=1e-6)
    np.testing.assert_allclose(out.output["gru"], p["gru"](state["gru"], x).output, rtol=1e-6)
    np.testing.assert_array_equal(out.output["delay"], 0.0)
    assert isinstance(out.next_state, dict)
    assert jax.tree.map(jnp.shape, out.next_state) == jax.tree.map(jnp.shape, state)
    np.testing.assert_array_equal(out.next_state["delay"]["buffer"][:, 0], x)
    assert out.rollout_extras == {"lstm": None, "gru": None, "delay": None}


def test_dict_container_reset_routes_per_child():
    p = Parallel(lstm=LSTM(D, H, nnx.Rngs(0)), delay=Delay(jnp.zeros(D), 2))
    state, _, _ = _run(p, p.initialize_state(B), [_x(t) for t in range(3)])
    assert _nonzero(state["lstm"]) and _nonzero(state["delay"])
    reset = p.reset_state(state)
    assert set(reset) == {"lstm", "delay"}
    for leaf in jax.tree.leaves(reset):
        np.testing.assert_array_equal(leaf, 0.0)
    done = jnp.array([True, False, False])
    mixed = select_where(done, reset, state)
    for m_leaf, s_leaf in zip(jax.tree.leaves(mixed), jax.tree.leaves(state)):
        np.testing.assert_array_equal(m_leaf[0], 0.0)
        np.testing.assert_array_equal(m_leaf[1:], s_leaf[1:])


def test_parallel_extras_and_replay_routed_by_name():
    p = Parallel(a=Tag(1.0), b=Tag(2.0), n=Normalizer(D))
    x = _x()
    out = p(p.initialize_state(B), x)
    assert set(out.rollout_extras) == {"a", "b", "n"}
    np.testing.assert_array_equal(out.rollout_extras["a"], 1.0)
    np.testing.assert_array_equal(out.rollout_extras["b"], 2.0)
    np.testing.assert_array_equal(out.rollout_extras["n"], x)
    fed = {"a": jnp.full((B,), 5.0), "b": jnp.full((B,), 6.0), "n": x}
    replay = p(p.initialize_state(B), x, fed)
    np.testing.assert_allclose(replay.output["a"], x + 5.0, rtol=1e-6)
    np.testing.assert_allclose(replay.output["b"], x + 6.0, rtol=1e-6)


def test_parallel_replay_of_two_samplers():
    rngs = nnx.Rngs(3)
    p = Parallel(u=NormalTanhSampler(rngs), v=NormalSampler(rngs))
    x = _x()
    roll = p(p.initialize_state(B), x)
    replay = p(p.initialize_state(B), x, roll.rollout_extras)
    for k in ("u", "v"):
        np.testing.assert_array_equal(replay.output[k]["action"], roll.output[k]["action"])
        np.testing.assert_allclose(replay.output[k]["log_likelihood"],
                                   roll.output[k]["log_likelihood"], atol=1e-6)
    # swapping the stored actions changes the result: the routing is by name
    swapped = {"u": roll.rollout_extras["v"], "v": roll.rollout_extras["u"]}
    bad = p(p.initialize_state(B), x, swapped)
    assert not np.allclose(bad.output["v"]["action"], roll.output["v"]["action"])


def test_concat_dispatches_per_key_and_concatenates_in_order():
    rngs = nnx.Rngs(0)
    c = Concat(b=Dense(2, 3, rngs), a=Delay(jnp.zeros((2, 2)), 0))
    x = {"a": jnp.ones((B, 2, 2)), "b": _x(d=2), "unused": jnp.zeros((B, 7))}
    out = c(c.initialize_state(B), x)
    assert out.output.shape == (B, 3 + 4)
    np.testing.assert_allclose(out.output[:, :3], c["b"]((), x["b"]).output, rtol=1e-6)
    np.testing.assert_array_equal(out.output[:, 3:], 1.0)
    assert set(out.next_state) == {"a", "b"}


def test_concat_input_errors():
    c = Concat(a=ConstReg(0.0), b=ConstReg(0.0))
    with pytest.raises(ValueError, match="Concat: x must be a dict with keys"):
        c(c.initialize_state(B), _x())
    with pytest.raises(ValueError, match=r"Concat: x is missing keys \['b'\]"):
        c(c.initialize_state(B), {"a": _x()})


def test_concat_carry_extras_and_replay():
    c = Concat(r=LSTM(D, H, nnx.Rngs(0)), t=Tag(4.0))
    x = {"r": _x(), "t": _x(1, d=2)}
    state = c.initialize_state(B)
    assert set(state) == {"r", "t"} and state["t"] == ()
    out = c(state, x)
    assert out.output.shape == (B, H + 2)
    np.testing.assert_array_equal(out.rollout_extras["t"], 4.0)
    assert out.rollout_extras["r"] is None
    replay = c(state, x, {"r": None, "t": jnp.full((B,), 8.0)})
    np.testing.assert_allclose(replay.output[:, :H], out.output[:, :H], rtol=1e-6)
    np.testing.assert_allclose(replay.output[:, H:], x["t"] + 8.0, rtol=1e-6)


@pytest.mark.parametrize("kind", ["parallel", "concat", "map", "merge"])
def test_update_statistics_through_dict_containers(kind):
    n1, n2 = Normalizer(D), Normalizer(2)
    if kind == "parallel":
        net = Parallel(n1=n1, other=Sequential(Dense(D, 2, nnx.Rngs(0)), n2))
        make_x = lambda t: _x(t)
        pick = lambda xs: (xs, None)
    elif kind == "concat":
        net = Concat(n1=n1, n2=n2)
        make_x = lambda t: {"n1": _x(t), "n2": _x(t + 50, d=2)}
        pick = lambda xs: ([x["n1"] for x in xs], [x["n2"] for x in xs])
    elif kind == "map":
        net = Map(n1=n1, n2=n2)
        make_x = lambda t: {"n1": _x(t), "n2": _x(t + 50, d=2)}
        pick = lambda xs: ([x["n1"] for x in xs], [x["n2"] for x in xs])
    else:
        net = Merge(p=Parallel(y=n1), q=Parallel(z=Sequential(Dense(D, 2, nnx.Rngs(0)), n2)))
        make_x = lambda t: _x(t)
        pick = lambda xs: (xs, None)
    xs = [make_x(t) for t in range(T)]
    _, _, extras = _run(net, net.initialize_state(B), xs)
    stacked = _stack(extras)
    net.update_statistics(stacked)
    ins1, ins2 = pick(xs)
    ins1 = jnp.stack(ins1).reshape(-1, D)
    assert float(n1.counter[...]) == T * B
    np.testing.assert_allclose(n1.running_mean, ins1.mean(0), rtol=1e-5, atol=1e-6)
    assert float(n2.counter[...]) == T * B
    if ins2 is not None:
        np.testing.assert_allclose(n2.running_mean, jnp.stack(ins2).reshape(-1, 2).mean(0),
                                   rtol=1e-5, atol=1e-6)
    # statistics change the forward output only now, after update_statistics
    out = net(net.initialize_state(B), xs[0])
    assert jax.tree.leaves(out.output)


@pytest.mark.parametrize("cls", [Parallel, Concat, Map])
def test_dict_container_regularization_sum_and_metric_prefixes(cls):
    rngs = nnx.Rngs(0)
    sampler = NormalSampler(rngs, entropy_weight=0.2)
    # Concat needs array outputs: flatten the sampler dict after it
    pol = Sequential(sampler, Flattener()) if cls is Concat else sampler
    net = cls(first=ConstReg(0.5), second=ConstReg(-0.125), pol=pol)
    x = _x()
    inp = x if cls is Parallel else {"first": x, "second": x, "pol": x}
    out = net(net.initialize_state(B), inp)
    alone = sampler((), x)
    np.testing.assert_allclose(out.regularization_loss, 0.375 + alone.regularization_loss,
                               rtol=1e-6)
    assert float(alone.regularization_loss) < 0  # an entropy *bonus*
    p = "pol/0/" if cls is Concat else "pol/"
    assert set(out.metrics) == {"first/reg", "second/reg", p + "entropy", p + "sigma"}
    np.testing.assert_allclose(out.metrics["second/reg"], -0.125)


def test_nested_metric_prefixes():
    net = Sequential(ConstReg(0.0), Parallel(a=Sequential(ConstReg(1.0), ConstReg(2.0))))
    out = net(net.initialize_state(B), _x())
    assert set(out.metrics) == {"0/reg", "1/a/0/reg", "1/a/1/reg"}
    np.testing.assert_allclose(out.regularization_loss, 3.0)


@pytest.mark.parametrize("cls", [Parallel, Concat, Map, Merge])
def test_keyword_and_positional_dict_construction(cls):
    a, b = ConstReg(0.0), ConstReg(1.0)
    by_kw = cls(a=a, b=b)
    by_dict = cls({"a": a, "b": b})
    assert list(by_kw.components) == list(by_dict.components) == ["a", "b"]
    assert by_kw["a"] is a and by_dict["b"] is b
    name = cls.__name__
    with pytest.raises(ValueError, match=f"{name}: pass either a positional dict or keyword"):
        cls({"a": a}, b=b)
    with pytest.raises(ValueError, match=f"{name}: needs at least one child module"):
        cls()
    with pytest.raises(ValueError, match=f"{name}: needs at least one child module"):
        cls({})
    with pytest.raises(TypeError, match=f"{name}: child 'b' must be a StatefulModule, got Linear"):
        cls(a=a, b=nnx.Linear(2, 2, rngs=nnx.Rngs(0)))


# --- Splitter ------------------------------------------------------------------


def test_splitter_slices_in_argument_order():
    s = Splitter(mean=2, std=2, value=1)
    assert s.initialize_state(B) == ()
    x = jnp.arange(B * 6, dtype=jnp.float32).reshape(B, 6)
    out = s((), x)
    assert list(out.output) == ["mean", "std", "value"]
    np.testing.assert_array_equal(out.output["mean"], x[:, :2])
    np.testing.assert_array_equal(out.output["std"], x[:, 2:4])
    np.testing.assert_array_equal(out.output["value"], x[:, 4:5])
    assert out.next_state == () and out.rollout_extras is None
    assert list(Splitter({"b": 1, "a": 3})((), x).output) == ["b", "a"]


def test_splitter_errors():
    with pytest.raises(ValueError, match=r"Splitter: x has shape \(3, 4\), expected \(B, >= 5\)"):
        Splitter(a=4, b=1)((), jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="Splitter: x has shape"):
        Splitter(a=1)((), jnp.zeros((3,)))
    with pytest.raises(ValueError, match="not both"):
        Splitter({"a": 1}, b=2)
    with pytest.raises(ValueError, match="at least one"):
        Splitter()
    with pytest.raises(ValueError, match="size of slice 'a' must be positive"):
        Splitter(a=0)


def test_container_under_jit_with_split_merge():
    net = Sequential(Dense(D, H, nnx.Rngs(0)), Parallel(l=LSTM(H, H, nnx.Rngs(1)),
                                                        d=Delay(jnp.zeros(H), 1)))
    graphdef, params = nnx.split(net)

    @jax.jit
    def step(params, state, x):
        out = nnx.merge(graphdef, params)(state, x)
        return out.next_state, out.output

    s_e = s_j = net.initialize_state(B)
    for t in range(2):
        out = net(s_e, _x(t))
        s_e = out.next_state
        s_j, y = step(params, s_j, _x(t))
        for a, b in zip(jax.tree.leaves(y), jax.tree.leaves(out.output)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_concat_keeps_construction_order_through_split_merge():
    # nnx.split/merge rebuilds the children dict with sorted keys; the
    # concatenation order must stay the construction order (eager == jitted).
    from nnx_ppo.networks.utils import Scale

    c = Concat(b=Scale(2.0), a=Scale(1.0))
    x = {"a": jnp.ones((B, 1)), "b": jnp.ones((B, 2))}
    eager = c(c.initialize_state(B), x).output
    np.testing.assert_array_equal(eager[0], [2.0, 2.0, 1.0])
    graphdef, params = nnx.split(c)
    merged = nnx.merge(graphdef, params)
    np.testing.assert_array_equal(merged(merged.initialize_state(B), x).output, eager)
    jitted = jax.jit(lambda p, s, x: nnx.merge(graphdef, p)(s, x).output)(
        params, c.initialize_state(B), x)
    np.testing.assert_array_equal(jitted, eager)
