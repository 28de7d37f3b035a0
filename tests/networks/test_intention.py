"""Tests for nnx_ppo.networks.factories: sizes, wiring, the replay guarantee, training."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import Box, Discrete, EnvState, RLEnv
from nnx_ppo.networks.factories import (
    INTENTION_CPU_SIZE,
    INTENTION_USERS_SIZE,
    count_parameters,
    make_intention_network,
)
from nnx_ppo.networks.variational import VariationalBottleneck
from nnx_ppo.testing import check_replay_consistency

# Tiny sizes for the tests that run the network: on a CPU their time is
# compilation, which grows with the number of layers.
TINY = {"encoder_sizes": (), "latent_size": 4, "decoder_sizes": (16,), "critic_sizes": (16,)}


@nnx.jit
def _forward(net, state, obs):
    """One compiled step (eager calls compile op by op, which is slower)."""
    return net(state, obs)


class ReferenceTracking(RLEnv):
    """Follow a moving reference: a toy imitation task with a dict observation.

    The reference is ``n_frames`` future frames of a ``dim``-dimensional
    sinusoid (``obs["reference"]`` ``[n_frames * dim]``), the proprioception
    the body's position (``obs["proprioception"]`` ``[dim]``). The action
    moves the body (``pos += 0.3 * action``); the reward is minus the distance
    to the next reference frame. Episodes end at random (terminated, with
    probability ``p_end`` per step) or after ``max_steps`` (truncated), so a
    short rollout holds resets.
    """

    def __init__(self, dim=2, n_frames=3, max_steps=6, p_end=0.1):
        self.dim, self.n_frames, self.max_steps, self.p_end = dim, n_frames, max_steps, p_end

    @property
    def observation_space(self):
        return {"reference": Box((self.n_frames * self.dim,)), "proprioception": Box((self.dim,))}

    @property
    def action_space(self):
        return Box((self.dim,), -1.0, 1.0)

    def _frames(self, phase, t):
        """Reference frames ``t + 1 ... t + n_frames``: ``[n_frames, dim]``."""
        times = t + 1.0 + jnp.arange(self.n_frames, dtype=jnp.float32)[:, None]
        freqs = 0.5 + jnp.arange(self.dim, dtype=jnp.float32)[None, :] * 0.25
        return jnp.sin(freqs * times + phase)

    def _state(self, pos, phase, steps, key, reward, done, truncated):
        obs = {"reference": jnp.reshape(self._frames(phase, steps.astype(jnp.float32)), (-1,)),
               "proprioception": pos}
        return EnvState(obs=obs, reward=reward, done=done, metrics={},
                        info={"truncated": truncated, "steps": steps},
                        data={"pos": pos, "phase": phase, "key": key})

    def reset(self, key):
        key, k_pos, k_phase = jax.random.split(key, 3)
        pos = jax.random.uniform(k_pos, (self.dim,), minval=-1.0, maxval=1.0)
        phase = jax.random.uniform(k_phase, (), maxval=2 * jnp.pi)
        zero = jnp.zeros((), jnp.float32)
        return self._state(pos, phase, jnp.zeros((), jnp.int32), key, zero, zero, zero)

    def step(self, state, action):
        key, k_end = jax.random.split(state.data["key"])
        target = self._frames(state.data["phase"], state.info["steps"].astype(jnp.float32))[0]
        pos = jnp.clip(state.data["pos"] + 0.3 * action, -2.0, 2.0)
        reward = -jnp.sum(jnp.abs(pos - target))
        steps = state.info["steps"] + 1
        terminated = jax.random.uniform(k_end) < self.p_end
        truncated = (steps >= self.max_steps) & ~terminated
        done = (terminated | truncated).astype(jnp.float32)
        return self._state(pos, state.data["phase"], steps, key, reward, done, truncated.astype(jnp.float32))


def _obs(b, seed=0):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    return {"reference": {"frames": jax.random.normal(k1, (b, 5, 8)), "phase": jax.random.normal(k2, (b, 1))},
            "proprioception": jax.random.normal(k3, (b, 6)),
            "other": jax.random.normal(k4, (b, 3))}


OBS_SIZE = {"reference": {"frames": (5, 8), "phase": 1}, "proprioception": 6, "other": 3}  # R = 41, P = 6, F = 50


def test_users_size_parameter_count():
    """The published size (built abstractly: 3.5M parameters): actor
    512 (R + P) + 1026 A + 1,669,240, critic 512 F + 788,993."""
    R, P, A = 640, 300, 38
    net = nnx.eval_shape(lambda: make_intention_network(
        observation_size={"reference": R, "proprioception": P}, action_size=A, rngs=nnx.Rngs(0),
        **INTENTION_USERS_SIZE))
    actor, critic = count_parameters(net[-1].action), count_parameters(net[-1].value)
    assert actor == 512 * (R + P) + 1026 * A + 1_669_240 == 2_189_508
    assert critic == 512 * (R + P) + 788_993 == 1_270_273
    assert count_parameters(net) == 3_459_781
    out = nnx.eval_shape(lambda n: n(n.initialize_state(4), {"reference": jnp.zeros((4, R)),
                                                             "proprioception": jnp.zeros((4, P))}).output, net)
    assert out.actions.shape == (4, A) and out.loglikelihoods.shape == (4,) and out.value_estimates.shape == (4,)


@pytest.mark.parametrize("decoder", ["mlp", "lstm"])
def test_cpu_size_shapes_carry_and_parameter_count(decoder):
    """Dict entries are flattened (R = 41, P = 6, F = 50); the carry holds one
    key per env for the bottleneck (and h, c for the LSTM decoder). Built and
    called abstractly (shapes only), as compiling it is slow on a CPU."""
    B, A, R, P, F = 3, 4, 41, 6, 50
    net = nnx.eval_shape(lambda: make_intention_network(
        observation_size=OBS_SIZE, action_size=A, rngs=nnx.Rngs(0), decoder=decoder, **INTENTION_CPU_SIZE))
    state, out = nnx.eval_shape(lambda n, o: (n.initialize_state(B), n(n.initialize_state(B), o).output),
                                net, _obs(B))
    assert out.actions.shape == (B, A) and out.loglikelihoods.shape == (B,) and out.value_estimates.shape == (B,)
    encoder = net[-1].action[1]["intention"]
    assert isinstance(encoder[-1], VariationalBottleneck)
    keys = state[-1]["action"][1]["intention"][-1]
    assert keys.shape == (B,) and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    assert count_parameters(net[-1].value) == 64 * F + 4_289
    if decoder == "mlp":
        assert count_parameters(net[-1].action) == 64 * (R + P) + 130 * A + 11_552
    else:  # two stacked LSTMs of 64: carries (h, c) of [B, 64]
        assert state[-1]["action"][2][0].shape == (B, 64) and state[-1]["action"][3][1].shape == (B, 64)
        lstm = 4 * (16 + P + 64 + 1) * 64 + 4 * (64 + 64 + 1) * 64
        assert count_parameters(net[-1].action) == (64 * R + 6_304) + lstm + (64 * 2 * A + 2 * A)


def test_the_kl_enters_the_loss_with_kl_weight():
    net = make_intention_network(observation_size=OBS_SIZE, action_size=2, rngs=nnx.Rngs(0), kl_weight=0.25,
                                 entropy_weight=0.0, **TINY)
    out = _forward(net, net.initialize_state(3), _obs(3))
    (name, kl), = [(k, v) for k, v in out.metrics.items() if k.endswith("kl_divergence")]
    assert name == "1/action/1/intention/2/kl_divergence"  # Normalizer, PPOAdapter/action, Concat/intention
    assert float(kl) > 0
    np.testing.assert_allclose(float(out.regularization_loss), 0.25 * float(kl), rtol=1e-6)


def test_the_decoder_sees_only_the_latent_and_the_proprioception():
    """With the encoder's output layer zeroed the latent no longer depends on
    the reference, and neither does the action; the proprioception still
    moves the action, and the critic reads everything."""
    B = 3
    net = make_intention_network(observation_size=OBS_SIZE, action_size=2, rngs=nnx.Rngs(0), **TINY)
    net.eval()  # the action is tanh(mean); the latent is still sampled, from the carry's keys
    state = net.initialize_state(B)
    obs = _obs(B)
    moved_reference = {**obs, "reference": _obs(B, seed=1)["reference"]}
    moved_proprioception = {**obs, "proprioception": obs["proprioception"] + 1.0}
    moved_other = {**obs, "other": obs["other"] + 1.0}
    act = lambda o: _forward(net, state, o).output.actions
    value = lambda o: _forward(net, state, o).output.value_estimates
    assert not jnp.allclose(act(obs), act(moved_reference))
    assert jnp.array_equal(act(obs), act(moved_other))  # the actor reads only its two entries
    assert not jnp.allclose(value(obs), value(moved_other))

    last = net[-1].action[1]["intention"][-2]  # Dense(R, 2 L) before the bottleneck
    last.kernel[...] = jnp.zeros_like(last.kernel[...])
    last.bias[...] = jnp.zeros_like(last.bias[...])
    assert jnp.array_equal(act(obs), act(moved_reference))
    assert not jnp.allclose(act(obs), act(moved_proprioception))
    assert not jnp.allclose(value(obs), value(moved_reference))


def _check_replay(net, env, precision="default"):
    report = check_replay_consistency(net, env, n_envs=8, rollout_length=12, n_minibatches=4, seed=2,
                                      precision=precision)
    assert report.n_resets > 0
    assert report.passed, str(report)


@pytest.mark.parametrize("precision", ["default", "bfloat16"])
def test_replay_guarantee_lstm_decoder(precision):
    """A rollout with episode resets, replayed in 4 minibatches: the latent
    samples, the LSTM decoder's carry, log-likelihoods and values come back
    exactly, also with bfloat16 matrix inputs. (The MLP decoder's: after training, below.)"""
    env = ReferenceTracking(max_steps=5, p_end=0.15)
    _check_replay(make_intention_network(env, nnx.Rngs(1), decoder="lstm", **TINY), env, precision)


@pytest.mark.parametrize("replay_unroll", [1, 12])
def test_replay_guarantee_stacked_lstm_decoder(replay_unroll):
    """Three LSTM layers reproduce the rollout as one layer does: replayed
    each alone, and (unrolled, as on an accelerator) together along the
    diagonals of their steps (``replay_stacked``); before the first update
    and, as the trainer checks every iteration, after updates."""
    env = ReferenceTracking(max_steps=5, p_end=0.15)
    net = make_intention_network(env, nnx.Rngs(1), decoder="lstm", **{**TINY, "decoder_sizes": (16, 16, 16)})
    report = check_replay_consistency(net, env, n_envs=8, rollout_length=12, n_minibatches=4, seed=2,
                                      replay_unroll=replay_unroll)
    assert report.n_resets > 0
    assert report.passed, str(report)
    rows = []
    train_ppo(env, net, TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=12, n_minibatches=4, total_steps=8 * 12 * 3,
                                                  learning_rate=1e-3, replay_unroll=replay_unroll),
                                    eval=EvalConfig(enabled=False)), log_fn=lambda m, s: rows.append(m))
    assert len(rows) == 3 and max(r["replay/max_error"] for r in rows) <= 1e-5


def test_trains_end_to_end_then_replays_exactly():
    """A short PPO run (3,072 steps, MLP decoder): finite losses, the KL is
    logged, the encoder's weights move, the trainer's replay check stays
    exact, and afterwards (normalizer statistics and parameters moved) so
    does check_replay_consistency's."""
    env = ReferenceTracking()
    net = make_intention_network(env, nnx.Rngs(0), decoder="mlp", **TINY)
    encoder_out = net[-1].action[1]["intention"][-2]
    before = np.asarray(encoder_out.kernel[...])
    logs = []
    config = TrainConfig(ppo=PPOConfig(n_envs=16, rollout_length=16, total_steps=16 * 16 * 12, n_minibatches=2,
                                       learning_rate=1e-3),
                         eval=EvalConfig(enabled=False))
    result = train_ppo(env, net, config, log_fn=lambda metrics, steps: logs.append(metrics))
    assert result.total_steps == 3072 and len(logs) == 12
    kl = [v for k, v in logs[-1].items() if k.endswith("kl_divergence")]
    assert kl and all(np.isfinite(kl))
    assert all(np.isfinite(v) for m in logs for v in m.values() if isinstance(v, float))
    assert max(m["replay/max_error"] for m in logs) <= 1e-5
    assert not np.allclose(np.asarray(encoder_out.kernel[...]), before)
    _check_replay(net, ReferenceTracking(max_steps=5, p_end=0.15))


def test_argument_errors():
    with pytest.raises(ValueError, match="no reference entry 'target'"):
        make_intention_network(observation_size=OBS_SIZE, action_size=2, reference_key="target")
    with pytest.raises(ValueError, match="LSTM decoder needs at least one size"):
        make_intention_network(observation_size=OBS_SIZE, action_size=2, decoder="lstm", decoder_sizes=())
    with pytest.raises(ValueError, match="decoder must be 'mlp' or 'lstm'"):
        make_intention_network(observation_size=OBS_SIZE, action_size=2, decoder="gru")
    with pytest.raises(TypeError, match="must be a dict"):
        make_intention_network(observation_size=7, action_size=2)

    class DiscreteActions(ReferenceTracking):
        @property
        def action_space(self):
            return Discrete(3)

    with pytest.raises(TypeError, match="continuous"):
        make_intention_network(DiscreteActions())
