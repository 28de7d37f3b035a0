"""The replay guarantee, for a network holding every module the library ships."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import NetworkFn, ReplayMismatchError
from nnx_ppo.algorithms.ppo import collect_rollout, new_training_state
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential, Splitter
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.noise import BernoulliGate, DropoutMask, GaussianNoise
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import GRU, LSTM, SimpleRNN
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalSampler, NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, replay_flat
from nnx_ppo.networks.utils import Filter, Flattener, Map, Merge, Scale
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck
from nnx_ppo.testing import check_replay_consistency
from tests.algorithms.toy_envs import Target


class DictActionTarget(Target):
    """Target whose action is a dict; only ``action["squashed"]`` matters."""

    def step(self, state, action):
        return super().step(state, action["squashed"])


def everything_network(seed=0):
    rngs = nnx.Rngs(seed)
    relu = jax.nn.relu
    trunk = Sequential([
        Normalizer(3),
        Parallel(a=Dense(3, 8, rngs, activation=jnp.tanh), b=Scale(0.5)),
        Merge(first=Filter({"a": "a"}), second=Filter({"b": "b"})),
        Concat(
            a=Sequential([
                LSTM(8, 8, rngs, trainable_initial_state=True), GaussianNoise(0.1, rngs, fresh_keys_on_reset=True),
            ]),
            b=Sequential([Delay(jnp.zeros(3), 2), Dense(3, 8, rngs, activation=relu)]),
        ),
        GRU(16, 8, rngs),
        SimpleRNN(8, 8, rngs),
        DropoutMask(0.2, rngs),
        Parallel(
            gate=Sequential([Dense(8, 8, rngs), BernoulliGate(rngs, fresh_keys_on_reset=True)]),
            vb=Sequential([Dense(8, 8, rngs), VariationalBottleneck(4, rngs, 0.01)]),
            ar=Sequential([Dense(8, 8, rngs),
                           AR1VariationalBottleneck(4, rngs, 0.01, smoothness_weight=0.1, fresh_keys_on_reset=True)]),
        ),
        Flattener(),
        Dense(16, 4 + 3 + 4 + 1, rngs),
        Splitter(squashed=4, discrete=3, plain=4, value=1),
    ])
    action = Map(
        squashed=NormalTanhSampler(rngs, entropy_weight=0.01),
        discrete=CategoricalSampler(rngs, entropy_weight=0.01),
        plain=NormalSampler(rngs),
    )
    return Sequential([trunk, PPOAdapter(action=action, value=Sequential([Filter({"v": "value"}), Flattener()]))])


@pytest.mark.parametrize("precision", ["default", "bfloat16"])
def test_every_module_replays_exactly_after_training(precision):
    env = DictActionTarget(obs_size=3, action_size=2, max_steps=5, p_end=0.15)
    net = everything_network()
    config = TrainConfig(
        ppo=PPOConfig(n_envs=8, rollout_length=12, total_steps=8 * 12 * 3, n_minibatches=4, learning_rate=1e-3,
                      precision=precision),
        eval=EvalConfig(enabled=False),
    )
    rows = []
    train_ppo(env, net, config, log_fn=lambda m, s: rows.append(m))  # statistics, RNG streams and params moved
    assert max(r["replay/max_error"] for r in rows if "replay/max_error" in r) <= 1e-5
    report = check_replay_consistency(net, env, n_envs=8, rollout_length=12, n_minibatches=4, seed=3,
                                      precision=precision)
    assert report.n_resets > 0
    assert report.passed, str(report)
    assert report.max_abs_log_ratio <= 1e-5 and report.max_value_difference <= 1e-5


class ClassLevelNoise(StatefulModule):
    """Breaks the randomness rule: reads a class-level RNG inside __call__."""

    def __init__(self, rngs):
        self.rngs = rngs

    def __call__(self, state, x, rollout_extras=None):
        noise = jax.random.normal(self.rngs.noise(), x.shape)
        return StatefulModuleOutput(next_state=state, output=x + noise)

    def initialize_state(self, batch_size):
        return {"dummy": jnp.zeros((batch_size, 1))}


def test_class_level_rng_in_call_fails_the_check():
    rngs = nnx.Rngs(0)
    net = Sequential([
        Dense(3, 8, rngs),
        ClassLevelNoise(rngs),
        PPOAdapter(action=Sequential([Dense(8, 4, rngs), NormalTanhSampler(rngs)]), value=Dense(8, 1, rngs)),
    ])
    env = Target(max_steps=5)
    with pytest.raises(ReplayMismatchError, match=r"module layers/1 \(ClassLevelNoise\) mutates an NNX variable"):
        check_replay_consistency(net, env, n_envs=8, rollout_length=8, n_minibatches=4)


def test_stateless_network_passes_and_report_mentions_resets():
    rngs = nnx.Rngs(0)
    net = Sequential([
        Normalizer(3),
        PPOAdapter(action=Sequential([Dense(3, 4, rngs), NormalTanhSampler(rngs)]), value=Dense(3, 1, rngs)),
    ])
    report = check_replay_consistency(net, Target(max_steps=3), n_envs=4, rollout_length=8, n_minibatches=2)
    assert report.passed and report.n_resets > 0, str(report)


class ClassLevelNoiseNoCarry(ClassLevelNoise):
    """The same rule break in a module without carry leaves."""

    def initialize_state(self, batch_size):
        return ()


def _rule_breaking_net(cls):
    rngs = nnx.Rngs(0)
    return Sequential([
        Dense(3, 8, rngs),
        cls(rngs),
        PPOAdapter(action=Sequential([Dense(8, 4, rngs), NormalTanhSampler(rngs)]), value=Dense(8, 1, rngs)),
    ])


_TINY = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=4, total_steps=64),
                    eval=EvalConfig(enabled=False))


def test_trainer_stops_a_rule_breaking_module_with_a_carry():
    """The draw from a class-level RNG is found when the loss replay is
    traced, before any training, and the error names the module (more cases:
    tests/networks/test_rule_breaking_carry.py)."""
    with pytest.raises(ReplayMismatchError, match=r"module layers/1 \(ClassLevelNoise\) .* docs/custom_modules.md"):
        train_ppo(Target(max_steps=5), _rule_breaking_net(ClassLevelNoise), _TINY)


class DefaultStreamNoise(ClassLevelNoiseNoCarry):
    """The same, drawing from the Rngs' default stream (``rngs()``)."""

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=state, output=x + jax.random.normal(self.rngs(), x.shape))


def test_rule_breaking_module_without_carry_is_named_by_trainer_and_checker():
    """The error names the user's module class and its path in the network
    (not Flax's Rngs, whose __call__ runs innermost)."""
    named = r"module layers/1 \(ClassLevelNoiseNoCarry\) mutates an NNX variable"
    with pytest.raises(ReplayMismatchError, match=named):
        train_ppo(Target(max_steps=5), _rule_breaking_net(ClassLevelNoiseNoCarry), _TINY)
    with pytest.raises(ReplayMismatchError, match=named):
        check_replay_consistency(_rule_breaking_net(ClassLevelNoiseNoCarry), Target(max_steps=5))
    rngs = nnx.Rngs(0)
    deep = Sequential([Dense(3, 8, rngs), PPOAdapter(
        action=Sequential([Dense(8, 4, rngs), DefaultStreamNoise(rngs), NormalTanhSampler(rngs)]),
        value=Dense(8, 1, rngs))])
    with pytest.raises(ReplayMismatchError,
                       match=r"module layers/1/components/action/layers/1 \(DefaultStreamNoise\) mutates"):
        check_replay_consistency(deep, Target(max_steps=5))


def test_trainer_logs_the_replay_measurement():
    rngs = nnx.Rngs(0)
    net = Sequential([Normalizer(3), PPOAdapter(action=Sequential([Dense(3, 4, rngs), NormalTanhSampler(rngs)]),
                                                value=Dense(3, 1, rngs))])
    rows = []
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=4, total_steps=4 * 64),
                         eval=EvalConfig(enabled=False))
    train_ppo(Target(max_steps=3), net, config, log_fn=lambda m, s: rows.append(m))
    assert len(rows) == 4
    for row in rows:
        assert row["replay/max_error"] <= 1e-5, row


class SharedKeyNoise(GaussianNoise):
    """Breaks the randomness rule the other way: keys per env in its carry,
    but the noise of the whole batch drawn from the first env's key, so an
    env's noise depends on the batch it is stepped in."""

    def _transform(self, x, sample_keys):
        return x + jax.random.normal(sample_keys[0], x.shape), {}


def test_noise_shared_by_the_batch_is_named_by_trainer_and_checker():
    """Every carry matches, yet a minibatch replay cannot reproduce the
    rollout: the trainer's error and the checker's report both name the
    module and the cause (its output depends on the other envs)."""
    def net():
        rngs = nnx.Rngs(0)
        return Sequential([
            Dense(3, 8, rngs), SharedKeyNoise(1.0, rngs),
            PPOAdapter(action=Sequential([Dense(8, 4, rngs), NormalTanhSampler(rngs)]), value=Dense(8, 1, rngs)),
        ])

    said = r"module layers/1 \(SharedKeyNoise\): its output for an env depends on the other envs of the batch"
    report = check_replay_consistency(net(), Target(max_steps=5), n_envs=8, rollout_length=8, n_minibatches=4)
    assert not report.passed
    assert report.first_divergence is not None and __import__("re").search(said, report.first_divergence)
    with pytest.raises(ReplayMismatchError, match=f"First divergence: {said}"):
        train_ppo(Target(max_steps=5), net(), _TINY)


class WrongFastReplay(StatefulModule):
    """Identity whose fast ``replay_sequence`` (deliberately) adds 1: a probe of which replay runs."""

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=state, output=x)

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        out = replay_flat(self, carry, xs, rollout_extras, reset, stored_carry)
        return dataclasses.replace(out, output=out.output + 1.0)


@pytest.mark.parametrize("precision", ["default", "bfloat16"])
def test_bfloat16_replays_the_rollouts_own_step(precision):
    """Under bfloat16 the loss replay runs the network's own step, one step at a
    time (the rollout's shapes), not the modules' fast replays: on a TPU those
    round differently (bench/README, "Third sitting")."""
    rngs = nnx.Rngs(0)
    net = Sequential([
        WrongFastReplay(),
        PPOAdapter(action=Sequential([Dense(3, 4, rngs), NormalTanhSampler(rngs)]), value=Dense(3, 1, rngs)),
    ])
    report = check_replay_consistency(net, Target(max_steps=3), n_envs=4, rollout_length=8, n_minibatches=2,
                                      precision=precision)
    assert report.passed == (precision == "bfloat16"), str(report)


class DecayingCarry(StatefulModule):
    """A reset that keeps half the carry (it depends on the carry, so the
    rollout must record it at every step); the carry adds up the inputs."""

    def initialize_state(self, batch_size):
        return jnp.ones((batch_size, 3))

    def reset_state(self, prev_state):
        return 0.5 * prev_state

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=state + x, output=jnp.concatenate([x, state], axis=-1))


def _memory_net(rngs):
    return Sequential([
        DecayingCarry(),
        LSTM(6, 5, rngs),
        GRU(5, 5, rngs, trainable_initial_state=True),
        GaussianNoise(0.1, rngs, fresh_keys_on_reset=True),
        PPOAdapter(action=Sequential([Dense(5, 4, rngs), NormalTanhSampler(rngs)]), value=Dense(5, 1, rngs)),
    ])


def _rollout(net, env, n_envs, steps, every_carry=False):
    state = new_training_state(env, net, TrainConfig(ppo=PPOConfig(n_envs=n_envs, rollout_length=steps,
                                                                   total_steps=n_envs * steps)))
    view = NetworkFn.of(net)
    return jax.jit(lambda s: collect_rollout(env, view.with_state(params=s.params, rest=s.rest), s.rollout, s.key,
                                             steps, True, every_carry=every_carry).trajectory)(state)


def test_a_reset_value_that_depends_on_the_parameters_alone_is_kept_once():
    """The LSTM's zero state and the GRU's learned one are the same at every
    reset of a rollout: kept once, ``[1, B, H]``. A reset that keeps part of
    the carry, and fresh noise keys, are recorded at every step. Replayed from
    either, the trainer reproduces the rollout, resets included."""
    env = Target(max_steps=3)
    traj = _rollout(_memory_net(nnx.Rngs(0)), env, 4, 7)
    decaying, lstm, gru, noise, _ = traj.carry
    assert decaying.shape == (7, 4, 3) and noise.shape == (7, 4)
    assert jax.tree.map(jnp.shape, (lstm, gru)) == (((1, 4, 5), (1, 4, 5)), (1, 4, 5))
    assert bool(jnp.any(traj.reset[1:]))
    stored = traj.stored_carry()
    assert jax.tree.map(jnp.shape, stored) == jax.tree.map(jnp.shape, _rollout(_memory_net(nnx.Rngs(0)), env, 4, 7,
                                                                               every_carry=True).carry)
    np.testing.assert_array_equal(stored[1][0][1:], 0.0)  # the LSTM's zero state at every step after the first
    rows = []
    train_ppo(env, _memory_net(nnx.Rngs(0)), TrainConfig(
        ppo=PPOConfig(n_envs=8, rollout_length=7, n_minibatches=2, total_steps=8 * 7 * 3, learning_rate=1e-2),
        eval=EvalConfig(enabled=False)), log_fn=lambda m, s: rows.append(m))
    assert len(rows) == 3 and max(r["replay/max_error"] for r in rows) <= 1e-5


def test_a_one_step_rollout_replays_from_the_carry_it_started_with():
    """With one step, every leaf the replay reads is the start carry (also a
    leaf kept once, whose ``[1, B, ...]`` holds the reset value instead)."""
    traj = _rollout(_memory_net(nnx.Rngs(1)), Target(max_steps=3), 4, 1)
    as_numbers = lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(as_numbers(a), as_numbers(b)),
                 traj.stored_carry(), traj.start_carry)


def test_the_memory_estimate_counts_a_carry_kept_once_only_per_env():
    """An LSTM's carry is kept once per rollout, so a wider LSTM adds to the
    estimate only the carry each env holds (twice), nothing per step."""
    from nnx_ppo.algorithms.ppo import estimate_bytes
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = make("cue_memory")
    nets = [make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=h, encoder_sizes=[8]) for h in (8, 64)]
    carry_bytes = [sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(NetworkFn.of(n).initialize(1)[0]))
                   for n in nets]
    small, big = (estimate_bytes(env, n, 8, 16) for n in nets)
    assert big - small == 8 * 2 * (carry_bytes[1] - carry_bytes[0]) > 0


def test_replay_error_with_no_module_to_blame_names_the_compiler_settings(monkeypatch):
    """A replay mismatch whose trained network replays within the diagnosis'
    tolerance on a fresh rollout (a shipped network; the mismatch given) is
    not put on a module: the trainer's error says so, and names the settings
    of how XLA compiles that differ from JAX's defaults, or says that none does."""
    from nnx_ppo.algorithms.trainer import named_replay_error

    rngs = nnx.Rngs(0)
    net = Sequential([Normalizer(3), PPOAdapter(action=Sequential([Dense(3, 4, rngs), NormalTanhSampler(rngs)]),
                                                value=Dense(3, 1, rngs))])
    ppo = PPOConfig(n_envs=8, rollout_length=8, n_minibatches=4, total_steps=64)
    err = ReplayMismatchError("at iteration 3 the loss replay did not reproduce the rollout (1.55e-03)")
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # (read by the error only; the backend keeps its flags)
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    plain = str(named_replay_error(err, net, Target(max_steps=3), ppo))
    assert plain.startswith(str(err)) and "no module was found" in plain, plain
    assert "No compiler setting differs from JAX's defaults" in plain, plain
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_example=false")
    with jax.default_matmul_precision("highest"):
        named = str(named_replay_error(err, net, Target(max_steps=3), ppo))
    assert "no module was found" in named, named
    assert "jax_default_matmul_precision='highest'" in named, named
    assert "LIBTPU_INIT_ARGS='--xla_tpu_example=false'" in named, named
    monkeypatch.delenv("LIBTPU_INIT_ARGS")  # the run's own compiler options are named too
    own = str(named_replay_error(err, net, Target(max_steps=3), ppo, {"xla_tpu_scoped_vmem_limit_kib": "4096"}))
    assert "TrainConfig.compiler_options={'xla_tpu_scoped_vmem_limit_kib': '4096'}" in own, own


def test_trainer_diagnoses_a_mismatch_as_the_run_computes(monkeypatch):
    """The trainer's diagnosis of a replay mismatch replays at the run's
    precision and unroll, and a diagnosis whose replay departs with no
    divergence found leaves the error as it was."""
    from nnx_ppo.algorithms import _replay_diagnosis
    from nnx_ppo.algorithms.trainer import named_replay_error

    asked, found = {}, [1e-3]

    def diagnose(network, env, **kwargs):
        asked.update(kwargs)
        return _replay_diagnosis.ReplayDiagnosis(max_abs_log_ratio=found[0], max_value_difference=0.0,
                                                 first_divergence=None, n_resets=0)

    monkeypatch.setattr(_replay_diagnosis, "diagnose_replay", diagnose)
    err = ReplayMismatchError("at iteration 3 the loss replay did not reproduce the rollout")
    ppo = PPOConfig(n_envs=16, rollout_length=8, total_steps=128, precision="bfloat16", replay_unroll=4)
    assert named_replay_error(err, None, None, ppo) is err
    found[0] = float("nan")  # a non-finite replay is no exact one either
    assert named_replay_error(err, None, None, ppo) is err
    assert asked["precision"] == "bfloat16" and asked["replay_unroll"] == 4 and asked["n_envs"] == 8, asked
