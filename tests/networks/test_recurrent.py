"""Tests for nnx_ppo.networks.recurrent (SimpleRNN, LSTM, GRU, and cells of
your own on RecurrentCell)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Parallel, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.recurrent import GRU, LSTM, RecurrentCell, SimpleRNN
from nnx_ppo.networks.sampling_layers import NormalTanhSampler
from nnx_ppo.networks.types import StatefulModuleOutput, select_where
from nnx_ppo.networks.utils import Flattener

B, D_IN, H = 3, 4, 5


def _np_sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _x(seed=0, b=B):
    return jax.random.normal(jax.random.key(seed), (b, D_IN))


@pytest.mark.parametrize("cls", [LSTM, GRU, SimpleRNN])
def test_carry_and_output_shapes(cls):
    m = cls(D_IN, H, nnx.Rngs(0))
    state = m.initialize_state(B)
    out = m(state, _x())
    assert isinstance(out, StatefulModuleOutput)
    assert out.output.shape == (B, H)
    assert jax.tree.map(jnp.shape, out.next_state) == jax.tree.map(jnp.shape, state)
    assert out.rollout_extras is None
    assert jnp.ndim(out.regularization_loss) == 0
    if cls is LSTM:  # the original's (h, c)
        assert isinstance(state, tuple) and len(state) == 2
        assert state[0].shape == (B, H) and state[1].shape == (B, H)
        np.testing.assert_allclose(out.output, out.next_state[0])
    else:
        assert state.shape == (B, H)
        np.testing.assert_allclose(out.output, out.next_state)
    for leaf in jax.tree.leaves(state):
        np.testing.assert_array_equal(leaf, 0.0)


@pytest.mark.parametrize("cls", [LSTM, GRU, SimpleRNN])
def test_rngs_by_keyword(cls):
    m = cls(in_features=D_IN, hidden_features=H, rngs=nnx.Rngs(1))
    assert m(m.initialize_state(2), _x(b=2)).output.shape == (2, H)


def test_lstm_matches_reference_maths():
    m = LSTM(D_IN, H, nnx.Rngs(0))
    x = np.asarray(_x(1))
    h = np.asarray(jax.random.normal(jax.random.key(2), (B, H)))
    c = np.asarray(jax.random.normal(jax.random.key(3), (B, H)))
    out = m((jnp.asarray(h), jnp.asarray(c)), jnp.asarray(x))
    z = x @ np.asarray(m.kernel_x[...]) + h @ np.asarray(m.kernel_h[...]) + np.asarray(m.bias[...])
    i, f, g, o = np.split(z, 4, axis=-1)
    c_new = _np_sigmoid(f) * c + _np_sigmoid(i) * np.tanh(g)
    h_new = _np_sigmoid(o) * np.tanh(c_new)
    np.testing.assert_allclose(out.next_state[1], c_new, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.output, h_new, rtol=1e-5, atol=1e-5)
    # the forget bias starts at 1
    np.testing.assert_array_equal(np.asarray(m.bias[...])[H:2 * H], 1.0)


def test_gru_matches_reference_maths():
    m = GRU(D_IN, H, nnx.Rngs(0))
    x = np.asarray(_x(1))
    h = np.asarray(jax.random.normal(jax.random.key(2), (B, H)))
    out = m(jnp.asarray(h), jnp.asarray(x))
    kx, kh = np.asarray(m.kernel_x[...]), np.asarray(m.kernel_h[...])
    bx, bhn = np.asarray(m.bias_x[...]), np.asarray(m.bias_hn[...])
    zx = x @ kx + bx
    r = _np_sigmoid(zx[:, :H] + h @ kh[:, :H])
    u = _np_sigmoid(zx[:, H:2 * H] + h @ kh[:, H:2 * H])
    n = np.tanh(zx[:, 2 * H:] + r * (h @ kh[:, 2 * H:] + bhn))
    np.testing.assert_allclose(out.output, (1 - u) * n + u * h, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [LSTM, GRU, SimpleRNN])
def test_reset_returns_initial_state(cls):
    m = cls(D_IN, H, nnx.Rngs(0))
    state = m.initialize_state(B)
    for t in range(2):
        state = m(state, _x(t)).next_state
    assert any(float(jnp.abs(leaf).sum()) > 0 for leaf in jax.tree.leaves(state))
    reset = m.reset_state(state)
    for leaf in jax.tree.leaves(reset):
        assert leaf.shape == (B, H)
        np.testing.assert_array_equal(leaf, 0.0)
    # the trainer's per-env reset
    done = jnp.array([True, False, True])
    mixed = select_where(done, reset, state)
    for m_leaf, s_leaf in zip(jax.tree.leaves(mixed), jax.tree.leaves(state)):
        np.testing.assert_array_equal(m_leaf[0], 0.0)
        np.testing.assert_array_equal(m_leaf[1], s_leaf[1])


@pytest.mark.parametrize("cls", [LSTM, GRU, SimpleRNN])
def test_trainable_initial_state_gets_gradient(cls):
    m = cls(D_IN, H, nnx.Rngs(0), trainable_initial_state=True)
    x = _x()

    def loss(mod):
        state = mod.initialize_state(B)
        out = mod(state, x)
        out = mod(mod.reset_state(out.next_state), x)
        return jnp.sum(out.output ** 2) + jnp.sum(out.output)

    grads = nnx.grad(loss)(m)
    g_h = grads["initial_h"][...]
    assert g_h.shape == (H,)
    assert float(jnp.abs(g_h).sum()) > 0
    if cls is LSTM:
        assert float(jnp.abs(grads["initial_c"][...]).sum()) > 0
    # the initial state is the parameter tiled over the batch
    m.initial_h[...] = jnp.arange(H, dtype=jnp.float32)
    state = m.initialize_state(2)
    h0 = state[0] if cls is LSTM else state
    np.testing.assert_array_equal(h0, np.tile(np.arange(H, dtype=np.float32), (2, 1)))
    reset_h = m.reset_state(state)
    reset_h = reset_h[0] if cls is LSTM else reset_h
    np.testing.assert_array_equal(reset_h, h0)


def test_no_initial_state_params_by_default():
    m = LSTM(D_IN, H, nnx.Rngs(0))
    assert not hasattr(m, "initial_h")


def test_shape_errors_name_module_and_argument():
    m = LSTM(5, H, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"LSTM: x has shape \(4, 3\), expected \(B, 5\) \(in_features=5\)"):
        m(m.initialize_state(4), jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"LSTM: state\[0\] \(h\) has shape"):
        m((jnp.zeros((4, 2)), jnp.zeros((4, H))), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"LSTM: state\[1\] \(c\) has batch size 2"):
        m((jnp.zeros((4, H)), jnp.zeros((2, H))), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"LSTM: state must be the tuple \(h, c\)"):
        m({"h": jnp.zeros((4, H)), "c": jnp.zeros((4, H))}, jnp.zeros((4, 5)))
    g = GRU(5, H, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"GRU: x has shape \(4,\), expected \(B, 5\)"):
        g(g.initialize_state(4), jnp.zeros((4,)))
    with pytest.raises(ValueError, match=r"GRU: state has shape \(4, 3\), expected \(B, 5\)"):
        g(jnp.zeros((4, 3)), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match="GRU: hidden_features"):
        GRU(5, 0, nnx.Rngs(0))


@pytest.mark.parametrize("cls", [LSTM, GRU, SimpleRNN])
def test_jit_split_merge_matches_eager(cls):
    m = cls(D_IN, H, nnx.Rngs(0))
    graphdef, params = nnx.split(m)

    @jax.jit
    def step(params, state, x):
        out = nnx.merge(graphdef, params)(state, x)
        return out.next_state, out.output

    state_e = state_j = m.initialize_state(B)
    for t in range(3):
        out = m(state_e, _x(t))
        state_e = out.next_state
        state_j, y = step(params, state_j, _x(t))
        np.testing.assert_allclose(y, out.output, rtol=1e-5, atol=1e-6)


def test_lstm_forget_bias_sets_the_initial_forget_gate():
    from flax import nnx

    from nnx_ppo.networks.factories import make_recurrent_actor_critic
    from nnx_ppo.networks.recurrent import LSTM

    h = 5
    cell = LSTM(3, h, nnx.Rngs(0), forget_bias=3.0)
    bias = np.asarray(cell.bias[...])
    np.testing.assert_array_equal(bias[h:2 * h], 3.0)
    np.testing.assert_array_equal(np.delete(bias, np.s_[h:2 * h]), 0.0)
    np.testing.assert_array_equal(np.asarray(LSTM(3, h, nnx.Rngs(0)).bias[...])[h:2 * h], 1.0)  # the default
    with pytest.raises(ValueError, match="forget_bias must be a finite number"):
        LSTM(3, h, nnx.Rngs(0), forget_bias=float("inf"))
    with pytest.raises(ValueError, match="the GRU core has none"):
        make_recurrent_actor_critic(3, 2, nnx.Rngs(0), core="gru", forget_bias=3.0)
    net = make_recurrent_actor_critic(3, 2, nnx.Rngs(0), hidden_size=h, encoder_sizes=(4,), forget_bias=2.0)
    biases = [np.asarray(m.bias[...])[h:2 * h] for _, m in nnx.iter_modules(net) if isinstance(m, LSTM)]
    assert len(biases) == 2 and all((b == 2.0).all() for b in biases)  # actor's and critic's cores


# --- SimpleRNN -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", [None, jax.nn.relu])
def test_simple_rnn_matches_numpy(activation):
    """h' = act(x W_x + h W_h + b), tanh by default, for a few steps from a random h."""
    kwargs = {} if activation is None else {"activation": activation}
    m = SimpleRNN(D_IN, H, nnx.Rngs(0), **kwargs)
    kx, kh = np.asarray(m.kernel_x[...]), np.asarray(m.kernel_h[...])
    assert kx.shape == (D_IN, H) and kh.shape == (H, H)
    np.testing.assert_allclose(kh @ kh.T, np.eye(H), atol=1e-5)  # orthogonal
    m.bias[...] = jnp.linspace(-0.5, 0.5, H)  # (starts at zero; make it count)
    b = np.asarray(m.bias[...])
    act = np.tanh if activation is None else (lambda v: np.maximum(v, 0.0))
    h = np.asarray(jax.random.normal(jax.random.key(2), (B, H)))
    state = jnp.asarray(h)
    for t in range(3):
        x = np.asarray(_x(t))
        out = m(state, jnp.asarray(x))
        h = act(x @ kx + h @ kh + b)
        np.testing.assert_allclose(out.output, h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.next_state, h, rtol=1e-5, atol=1e-6)
        state = out.next_state


def test_simple_rnn_parameters_and_errors():
    m = SimpleRNN(D_IN, H, nnx.Rngs(0), trainable_initial_state=True)
    paths = sorted("/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param)))
    assert paths == ["bias", "initial_h", "kernel_h", "kernel_x"]
    np.testing.assert_array_equal(m.bias[...], 0.0)
    with pytest.raises(ValueError, match=r"SimpleRNN: x has shape \(4, 3\), expected \(B, 4\)"):
        m(m.initialize_state(4), jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match="SimpleRNN: state has batch size 2, expected 4"):
        m(jnp.zeros((2, H)), jnp.zeros((4, D_IN)))
    with pytest.raises(ValueError, match="SimpleRNN: activation must be callable"):
        SimpleRNN(D_IN, H, nnx.Rngs(0), activation="tanh")
    with pytest.raises(ValueError, match="SimpleRNN: in_features must be a positive int"):
        SimpleRNN(0, H, nnx.Rngs(0))


# --- cells of your own ---------------------------------------------------------------------------------------


class LeakyCell(RecurrentCell):
    """A user's cell in a few lines: h' = (1 - a) h + a tanh([x, h] W + b)."""

    def __init__(self, in_features, hidden_features, rngs, *, leak=0.5, **kwargs):
        super().__init__(in_features, hidden_features, **kwargs)
        self.leak = leak
        self.linear = nnx.Linear(in_features + hidden_features, hidden_features, rngs=rngs)

    def step(self, h, x):
        h = (1 - self.leak) * h + self.leak * jnp.tanh(self.linear(jnp.concatenate([x, h], axis=-1)))
        return h, h


class TraceCell(RecurrentCell):
    """One with a dict carry and a hoisted input projection (the fast replay):
    an Elman unit plus a slow trace of it; outputs both, side by side."""

    carry_keys = ("h", "trace")

    def __init__(self, in_features, hidden_features, rngs, **kwargs):
        super().__init__(in_features, hidden_features, **kwargs)
        self.w_x = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (in_features, hidden_features)))
        self.w_h = nnx.Param(nnx.initializers.orthogonal()(rngs.params(), (hidden_features, hidden_features)))

    def project_input(self, x):
        return x @ self.w_x[...]

    def step(self, carry, z):
        h = jnp.tanh(z + carry["h"] @ self.w_h[...])
        trace = 0.8 * carry["trace"] + 0.2 * h
        return {"h": h, "trace": trace}, jnp.concatenate([h, trace], axis=-1)


def test_a_cell_of_your_own_gets_the_contract_from_the_base():
    leaky = LeakyCell(D_IN, H, nnx.Rngs(0))
    state = leaky.initialize_state(B)
    assert state.shape == (B, H)
    np.testing.assert_array_equal(state, 0.0)
    out = leaky(state, _x())
    assert isinstance(out, StatefulModuleOutput) and out.rollout_extras is None
    assert out.output.shape == (B, H) and jnp.ndim(out.regularization_loss) == 0
    np.testing.assert_array_equal(leaky.reset_state(out.next_state), 0.0)
    assert leaky.update_statistics(None) is None
    with pytest.raises(ValueError, match=r"LeakyCell: x has shape \(3, 2\), expected \(B, 4\)"):
        leaky(state, jnp.zeros((B, 2)))

    trace = TraceCell(D_IN, H, nnx.Rngs(0), trainable_initial_state=True)
    assert {"initial_h", "initial_trace"} <= {p[0] for p, _ in nnx.to_flat_state(nnx.state(trace, nnx.Param))}
    trace.initial_trace[...] = jnp.ones(H)
    state = trace.initialize_state(B)
    assert set(state) == {"h", "trace"}
    np.testing.assert_array_equal(state["trace"], 1.0)
    out = trace(state, _x())
    assert out.output.shape == (B, 2 * H)
    done = jnp.array([True, False, True])
    mixed = select_where(done, trace.reset_state(out.next_state), out.next_state)
    np.testing.assert_array_equal(mixed["trace"][0], 1.0)
    np.testing.assert_array_equal(mixed["trace"][1], out.next_state["trace"][1])
    with pytest.raises(ValueError, match="TraceCell: state must be a dict with keys 'h' and 'trace'"):
        trace(state["h"], _x())
    with pytest.raises(NotImplementedError, match="Bare must define step"):
        class Bare(RecurrentCell):
            pass
        bare = Bare(D_IN, H)
        bare(bare.initialize_state(B), _x())


def _rolled_out(module, xs, reset):
    """``module`` stepped over ``xs`` ``[T, B, ...]`` as the rollout steps it, its
    carry reset where ``reset``: the start carry, the carries entering each step
    (leaves ``[T, B, ...]``) and the outputs ``[T, B, ...]``."""
    carry, carries, outputs = module.initialize_state(xs.shape[1]), [], []
    for t in range(xs.shape[0]):
        carry = select_where(reset[t], module.reset_state(carry), carry)
        carries.append(carry)
        out = module(carry, xs[t])
        outputs.append(out.output)
        carry = out.next_state
    stored = jax.tree.map(lambda *c: jnp.stack(c), *carries)
    return jax.tree.map(lambda c: c[0], stored), stored, jnp.stack(outputs)


@pytest.mark.parametrize("make", [
    lambda rngs: SimpleRNN(D_IN, H, rngs, trainable_initial_state=True),
    lambda rngs: TraceCell(D_IN, H, rngs, trainable_initial_state=True),
    lambda rngs: LeakyCell(D_IN, H, rngs, trainable_initial_state=True),
], ids=["SimpleRNN", "TraceCell", "LeakyCell"])
def test_replay_sequence_equals_the_step_by_step_replay(make):
    """The base's replay (the input projection for all steps at once when the
    cell has one, the generic replay otherwise) gives the rollout's outputs, and
    the step-by-step replay's gradients (the initial carry's too, through the resets)."""
    from nnx_ppo.networks.types import replay_in_time

    cell = make(nnx.Rngs(0))
    T = 6
    xs = jax.random.normal(jax.random.key(1), (T, B, D_IN))
    reset = jnp.zeros((T, B), bool).at[2, 1].set(True).at[4, 0].set(True)
    start, stored, outputs = _rolled_out(cell, xs, reset)
    graphdef, params = nnx.split(cell)

    def replay(params, fast):
        m = nnx.merge(graphdef, params)
        result = (m.replay_sequence if fast else lambda *a: replay_in_time(m, *a))(start, xs, None, reset, stored)
        return jnp.sum(result.output ** 2), result.output

    grad = jax.jit(jax.grad(replay, has_aux=True), static_argnums=1)
    g_fast, out_fast = grad(params, True)
    g_slow, out_slow = grad(params, False)
    np.testing.assert_allclose(out_fast, outputs, atol=1e-6)
    np.testing.assert_allclose(out_fast, out_slow, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_slow)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(g_fast["initial_h"][...]).sum()) > 0


def _scans(fn, *args) -> int:
    """How many ``scan`` loops the jaxpr of ``fn(*args)`` holds."""
    return sum(eqn.primitive.name == "scan" for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns)


@pytest.mark.parametrize("T, unroll", [(7, 7), (7, 2), (2, 2), (7, 1)])
def test_consecutive_cells_replay_together_as_each_alone(T, unroll):
    """In an unrolled replay, consecutive cells of a Sequential (an LSTM, a
    GRU with a learned initial state, a dict-carry cell of your own) replay
    together along the diagonals of their steps (``replay_stacked``): one
    loop over time instead of one per cell, the rollout's outputs and
    carries, and each cell's own replay's gradients (the initial state's
    too, through the resets). With fewer steps than cells (T=2 < 3), and in
    a rolled replay (unroll 1, a CPU's default), each cell replays alone."""
    from nnx_ppo.networks.recurrent import replays_in_stack
    from nnx_ppo.networks.types import unrolled

    rngs = nnx.Rngs(0)
    net = Sequential(LSTM(D_IN, H, rngs), GRU(H, H, rngs, trainable_initial_state=True), TraceCell(H, H, rngs),
                     Dense(2 * H, 2, rngs))
    assert [replays_in_stack(layer) for layer in net.layers] == [True, True, True, False]
    assert not replays_in_stack(LeakyCell(D_IN, H, rngs))  # no input projection of its own: replayed in time
    xs = jax.random.normal(jax.random.key(1), (T, B, D_IN))
    reset = jnp.zeros((T, B), bool).at[T - 1, 1].set(True).at[T // 2, 0].set(True)
    start, stored, outputs = _rolled_out(net, xs, reset)
    graphdef, params = nnx.split(net)

    def replay(params, together):
        m = nnx.merge(graphdef, params)
        if together:
            with unrolled(unroll):
                result = m.replay_sequence(start, xs, (None,) * 4, reset, stored)
            return jnp.sum(result.output ** 2), (result.output, result.carry)
        x, entering = xs, []
        for i, layer in enumerate(m.layers):
            result = layer.replay_sequence(start[i], x, None, reset, stored[i])
            x = result.output
            entering.append(result.carry)
        return jnp.sum(x ** 2), (x, tuple(entering))

    assert _scans(lambda p: replay(p, True), params) == (1 if T >= 3 and unroll > 1 else 3)
    assert _scans(lambda p: replay(p, False), params) == 3
    grad = jax.jit(jax.grad(replay, has_aux=True), static_argnums=1)
    (g_together, (out_together, entering_together)), (g_alone, (out_alone, entering_alone)) = (
        grad(params, True), grad(params, False))
    np.testing.assert_allclose(out_together, outputs, atol=1e-6)
    np.testing.assert_allclose(out_together, out_alone, atol=1e-6)
    for a, b in zip(jax.tree.leaves(entering_together), jax.tree.leaves(entering_alone)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_together), jax.tree.leaves(g_alone)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(g_together["layers"][1]["initial_h"][...]).sum()) > 0


# --- the replay guarantee and training, with the trainer --------------------------------------------------


def _actor_critic(core, obs=3, act=2, seed=0):
    """obs -> core (any [B, obs] -> [B, F] module) -> tanh-Gaussian policy and value heads."""
    rngs = nnx.Rngs(seed)
    cell = core(rngs)
    features = jax.eval_shape(lambda: cell(cell.initialize_state(1), jnp.zeros((1, obs))).output).shape[-1]
    return Sequential(cell, PPOAdapter(action=Sequential(Dense(features, 2 * act, rngs, init_scale=0.01),
                                                         NormalTanhSampler(rngs)),
                                       value=Dense(features, 1, rngs)))


@pytest.mark.parametrize("core", [
    lambda rngs: Sequential(Dense(3, 8, rngs, activation=jnp.tanh),
                            SimpleRNN(8, 8, rngs, trainable_initial_state=True)),
    lambda rngs: Sequential(Parallel(a=LeakyCell(3, 8, rngs), b=TraceCell(3, 8, rngs, trainable_initial_state=True)),
                            Flattener()),
], ids=["SimpleRNN", "own_cells"])
def test_replay_guarantee(core):
    """Before the first update the replay, minibatch by minibatch, reproduces
    the rollout's log-likelihoods and values, with episode resets inside the
    rollout (nnx_ppo.testing.check_replay_consistency, as the trainer does)."""
    from nnx_ppo.testing import check_replay_consistency
    from tests.algorithms.toy_envs import Target

    env = Target(obs_size=3, action_size=2, max_steps=5, p_end=0.15)
    report = check_replay_consistency(_actor_critic(core), env, n_envs=8, rollout_length=12, n_minibatches=4, seed=1)
    assert report.n_resets > 0
    assert report.passed, str(report)
    assert report.max_abs_log_ratio <= 1e-5 and report.max_value_difference <= 1e-5


def test_a_cell_of_your_own_trains():
    """PPO trains a network whose memory is the user's LeakyCell: the reward
    rises, the cell's weights move, and the replay is exact at every iteration."""
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from tests.algorithms.toy_envs import Target

    net = _actor_critic(lambda rngs: LeakyCell(3, 8, rngs))
    before = np.asarray(net.layers[0].linear.kernel[...])
    logs = []
    config = TrainConfig(ppo=PPOConfig(n_envs=16, rollout_length=8, total_steps=16 * 8 * 30, n_minibatches=2,
                                       learning_rate=1e-2),
                         eval=EvalConfig(enabled=False))
    train_ppo(Target(max_steps=5), net, config, log_fn=lambda metrics, steps: logs.append(metrics))
    rewards = [m["train/reward_mean"] for m in logs]
    # Measured: about -1.20 over the first 5 iterations, -1.08 over the last 5.
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.05, rewards
    assert max(m["replay/max_error"] for m in logs) <= 1e-5
    assert not np.allclose(np.asarray(net.layers[0].linear.kernel[...]), before)


def test_gru_update_bias_sets_the_initial_update_gate():
    """``update_bias`` is ``b_u`` (the middle third of ``bias_x``): with zero
    weights the state keeps ``sigmoid(update_bias)`` of itself per step."""
    from flax import nnx

    from nnx_ppo.networks.factories import make_recurrent_actor_critic

    h = 5
    cell = GRU(3, h, nnx.Rngs(0), update_bias=3.0)
    bias = np.asarray(cell.bias_x[...])
    np.testing.assert_array_equal(bias[h:2 * h], 3.0)
    np.testing.assert_array_equal(np.delete(bias, np.s_[h:2 * h]), 0.0)
    np.testing.assert_array_equal(np.asarray(GRU(3, h, nnx.Rngs(0)).bias_x[...]), 0.0)  # the default
    cell.kernel_x[...] = jnp.zeros_like(cell.kernel_x[...])
    cell.kernel_h[...] = jnp.zeros_like(cell.kernel_h[...])
    state = jnp.ones((2, h))
    new, _ = cell.step(state, cell.project_input(jnp.zeros((2, 3))))
    np.testing.assert_allclose(new, jax.nn.sigmoid(3.0) * state, rtol=1e-6)  # n = 0: only u * h is left
    with pytest.raises(ValueError, match="GRU: update_bias must be a finite number"):
        GRU(3, h, nnx.Rngs(0), update_bias=float("nan"))
    with pytest.raises(ValueError, match="the LSTM core has none"):
        make_recurrent_actor_critic(3, 2, nnx.Rngs(0), core="lstm", update_bias=3.0)
    net = make_recurrent_actor_critic(3, 2, nnx.Rngs(0), core="gru", hidden_size=h, encoder_sizes=(4,),
                                      update_bias=2.0)
    biases = [np.asarray(m.bias_x[...])[h:2 * h] for _, m in nnx.iter_modules(net) if isinstance(m, GRU)]
    assert len(biases) == 2 and all((b == 2.0).all() for b in biases)  # actor's and critic's cores
