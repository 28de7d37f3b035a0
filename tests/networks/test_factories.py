"""Tests for nnx_ppo.networks.factories."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import (
    make_actor_critic_for_env,
    make_mlp,
    make_mlp_actor_critic,
    make_recurrent_actor_critic,
)
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import PPONetworkOutput, select_where
from nnx_ppo.networks.utils import Flattener

B, OBS, ACT = 3, 5, 2
SMALL = dict(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
SMALL_RNN = dict(hidden_size=6, encoder_sizes=(8,))


def _obs(seed=0, d=OBS):
    return jax.random.normal(jax.random.key(seed), (B, d))


def _check_ppo_output(out, discrete, action_size=ACT):
    assert isinstance(out.output, PPONetworkOutput)
    o = out.output
    assert o.loglikelihoods.shape == (B,)
    assert o.value_estimates.shape == (B,)
    assert np.all(np.isfinite(o.loglikelihoods)) and np.all(np.isfinite(o.value_estimates))
    if discrete:
        assert o.actions.shape == (B,) and o.actions.dtype == jnp.int32
        assert np.all((np.asarray(o.actions) >= 0) & (np.asarray(o.actions) < action_size))
    else:
        assert o.actions.shape == (B, action_size)
        assert np.all(np.abs(np.asarray(o.actions)) <= 1.0)


def _find(module, cls):
    return [m for _, m in nnx.iter_graph(module) if isinstance(m, cls)]


# --- make_mlp --------------------------------------------------------------------


def test_make_mlp_layers_and_activation():
    mlp = make_mlp([4, 8, 3], nnx.Rngs(0), activation="tanh")
    assert isinstance(mlp, Sequential) and len(mlp) == 2
    assert [(d.in_features, d.out_features) for d in mlp.layers] == [(4, 8), (8, 3)]
    x = jax.random.normal(jax.random.key(0), (B, 4))
    out = mlp(mlp.initialize_state(B), x)
    assert out.output.shape == (B, 3)
    assert float(jnp.abs(out.output).max()) < 1.0  # tanh on the last layer too
    lin = make_mlp([4, 8, 3], nnx.Rngs(0), activation="tanh", activation_last_layer=False)
    h = lin[0]((), x).output  # hidden layers keep the activation
    np.testing.assert_allclose(lin(lin.initialize_state(B), x).output,
                               h @ lin[1].kernel[...] + lin[1].bias[...][None, :], rtol=1e-5, atol=1e-6)
    small = make_mlp([4, 3], nnx.Rngs(0), last_layer_init_scale=0.01)
    ref = make_mlp([4, 3], nnx.Rngs(0))
    np.testing.assert_allclose(small[0].kernel[...], 0.01 * ref[0].kernel[...], rtol=1e-5, atol=1e-8)
    relu = make_mlp([4, 3], nnx.Rngs(0), activation=jax.nn.relu)
    assert float(relu(relu.initialize_state(B), x).output.min()) >= 0.0
    with pytest.raises(ValueError, match="unknown activation 'nope'"):
        make_mlp([4, 3], nnx.Rngs(0), activation="nope")
    with pytest.raises(ValueError, match="make_mlp: sizes needs an input and an output size"):
        make_mlp([4], nnx.Rngs(0))


# --- make_mlp_actor_critic ---------------------------------------------------------


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("normalize_obs", [True, False])
def test_mlp_actor_critic(discrete, normalize_obs):
    net = make_mlp_actor_critic(OBS, ACT if not discrete else 3, rngs=nnx.Rngs(0),
                                discrete=discrete, normalize_obs=normalize_obs, **SMALL)
    assert isinstance(net, Sequential) and isinstance(net[-1], PPOAdapter)
    assert isinstance(net[0], Normalizer) == normalize_obs
    sampler_cls = CategoricalSampler if discrete else NormalTanhSampler
    assert len(_find(net, sampler_cls)) == 1
    state = net.initialize_state(B)
    out = net(state, _obs())
    _check_ppo_output(out, discrete, 3 if discrete else ACT)
    replay = net(state, _obs(), out.rollout_extras)
    np.testing.assert_allclose(replay.output.loglikelihoods, out.output.loglikelihoods, atol=1e-5)
    np.testing.assert_allclose(replay.output.value_estimates, out.output.value_estimates, atol=1e-6)
    if normalize_obs:
        np.testing.assert_array_equal(out.rollout_extras[0], _obs())
        net.update_statistics(jax.tree.map(lambda v: v[None], out.rollout_extras))
        assert float(net[0].counter[...]) == B
    # the regularization is the (negative) entropy bonus
    assert float(out.regularization_loss) != 0.0


def test_mlp_actor_critic_dict_obs_and_value_keys():
    obs_size = {"pos": 3, "img": (2, 2)}
    net = make_mlp_actor_critic(obs_size, ACT, rngs=nnx.Rngs(0), value_keys=("task", "aux"), **SMALL)
    assert isinstance(net[0], Normalizer) and isinstance(net[1], Flattener)
    x = {"pos": _obs(0, 3), "img": jax.random.normal(jax.random.key(1), (B, 2, 2))}
    out = net(net.initialize_state(B), x)
    o = out.output
    assert o.actions.shape == (B, ACT) and o.loglikelihoods.shape == (B,)
    assert set(o.value_estimates) == {"task", "aux"}
    assert all(v.shape == (B,) for v in o.value_estimates.values())
    # the first Dense layers see the flattened 3 + 4 features
    assert 7 in {d.in_features for d in _find(net, Dense)}


def test_mlp_actor_critic_without_hidden_layers():
    net = make_mlp_actor_critic(OBS, ACT, (), (), rngs=nnx.Rngs(0), normalize_obs=False)
    _check_ppo_output(net(net.initialize_state(B), _obs()), False)


# --- make_recurrent_actor_critic -----------------------------------------------------


@pytest.mark.parametrize("core", ["lstm", "gru"])
@pytest.mark.parametrize("shared_trunk", [False, True])
def test_recurrent_actor_critic(core, shared_trunk):
    net = make_recurrent_actor_critic(OBS, ACT, nnx.Rngs(0), core=core, shared_trunk=shared_trunk,
                                      **SMALL_RNN)
    cells = _find(net, LSTM if core == "lstm" else GRU)
    assert len(cells) == (1 if shared_trunk else 2)
    state = net.initialize_state(B)
    assert jax.tree.leaves(state), "a recurrent network has a non-empty carry"
    xs = [_obs(t) for t in range(3)]
    s = state
    for x in xs:
        out = net(s, x)
        s = out.next_state
        _check_ppo_output(out, False)
    assert jax.tree.map(jnp.shape, s) == jax.tree.map(jnp.shape, state)
    assert any(float(jnp.abs(leaf).sum()) > 0 for leaf in jax.tree.leaves(s))
    reset = net.reset_state(s)
    for leaf in jax.tree.leaves(reset):
        np.testing.assert_array_equal(leaf, 0.0)
    done = jnp.array([True, False, False])
    mixed = select_where(done, reset, s)
    for m_leaf, s_leaf in zip(jax.tree.leaves(mixed), jax.tree.leaves(s)):
        np.testing.assert_array_equal(m_leaf[0], 0.0)
        np.testing.assert_array_equal(m_leaf[1:], s_leaf[1:])
    # the carry changes the output: memory
    fresh = net(state, xs[-1], out.rollout_extras)
    assert not np.allclose(fresh.output.value_estimates, out.output.value_estimates)


def test_recurrent_actor_critic_discrete_and_errors():
    net = make_recurrent_actor_critic(OBS, 4, nnx.Rngs(0), core="gru", discrete=True,
                                      normalize_obs=False, **SMALL_RNN)
    _check_ppo_output(net(net.initialize_state(B), _obs()), True, 4)
    with pytest.raises(ValueError, match="core must be 'lstm' or 'gru'"):
        make_recurrent_actor_critic(OBS, ACT, nnx.Rngs(0), core="rnn")


# --- make_actor_critic_for_env --------------------------------------------------------


@pytest.mark.parametrize("spec,network", [
    ("cue_memory", "mlp"), ("cue_memory", "lstm"),
    ("gymnax:Pendulum-v1", "mlp"), ("gymnax:Pendulum-v1", "gru"),
])
def test_make_actor_critic_for_env(spec, network):
    envs = pytest.importorskip("nnx_ppo.envs")
    try:
        env = envs.make(spec)
    except ImportError as err:  # an optional backend (gymnax) missing
        pytest.skip(f"{spec}: {err}")
    kwargs = SMALL if network == "mlp" else SMALL_RNN
    net = make_actor_critic_for_env(env, network, nnx.Rngs(0), **kwargs)
    states = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), B))
    out = net(net.initialize_state(B), states.obs)
    discrete = spec == "cue_memory"
    action_size = env.action_space.n if discrete else env.action_space.shape[0]
    _check_ppo_output(out, discrete, action_size)
    if network != "mlp":
        assert jax.tree.leaves(net.initialize_state(B))
    # the actions can be sent to the env
    stepped = jax.vmap(env.step)(states, out.output.actions)
    assert stepped.reward.shape == (B,)


def test_make_actor_critic_for_env_unknown_network():
    envs = pytest.importorskip("nnx_ppo.envs")
    with pytest.raises(ValueError, match="network must be 'mlp', 'lstm' or 'gru'"):
        make_actor_critic_for_env(envs.make("cue_memory"), "transformer")


def test_a_tuple_action_size_is_a_named_error():
    """The original's Parrot env gives a tuple action_size; the factories
    build one flat head, so they say what to do instead of failing later."""
    import numpy as np
    from flax import nnx

    from nnx_ppo.networks.factories import make_mlp_actor_critic

    with pytest.raises(TypeError, match=r"action_size must be an int .* got \(3,\); .* by hand"):
        make_mlp_actor_critic(3, (3,), rngs=nnx.Rngs(0))
    make_mlp_actor_critic(3, np.int64(2), rngs=nnx.Rngs(0))  # a NumPy integer is an int


@pytest.mark.parametrize("obs_size", [{"a": 2.5}, "x", {}])
def test_an_obs_size_that_is_not_shapes_is_refused(obs_size):
    """``obs_size`` must be an int, a tuple of ints or a pytree of them; anything
    else fails in one line naming the factory (it is not read as some width)."""
    expected = r": expected shapes \(ints or tuples of ints\)"
    with pytest.raises(ValueError, match="make_mlp_actor_critic" + expected):
        make_mlp_actor_critic(obs_size, 2, (8,), (8,), nnx.Rngs(0), normalize_obs=False)
    with pytest.raises(ValueError, match="make_recurrent_actor_critic" + expected):
        make_recurrent_actor_critic(obs_size, 2, nnx.Rngs(0), normalize_obs=False)
