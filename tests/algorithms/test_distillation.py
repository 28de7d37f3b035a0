"""Distillation: the student's replay is exact, it scores the teacher's
actions, and it learns what the teacher knows (also from a privileged teacher
whose view the student lacks)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.distillation import DistillationConfig, train_distillation
from nnx_ppo.algorithms.evaluation import evaluate
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.ppo import RolloutState, collect_rollout
from nnx_ppo.envs import make
from nnx_ppo.networks.adapter import PPOAdapter, extras_for_actions
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_actor_critic_for_env
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.utils import Map

# LQR gains for the [-1, 1] action on the full cart-pole state [x, x_dot, theta, theta_dot].
K = jnp.array([0.785, 1.383, 9.033, 2.389], jnp.float32)


def lqr_teacher() -> PPOAdapter:
    """A fixed linear state-feedback policy (mean ``K . s``) that keeps the
    pole up for the whole episode; it reads velocities."""
    rngs = nnx.Rngs(0)
    head = Dense(4, 2, rngs)
    head.kernel[...] = jnp.stack([K, jnp.zeros(4)], axis=1)  # columns: mean, std pre-activation
    return PPOAdapter(action=Sequential(head, NormalTanhSampler(rngs)), value=Dense(4, 1, rngs))


def config(total_steps, every=None, lr=3e-3, **ppo):
    return TrainConfig(
        ppo=PPOConfig(n_envs=32, rollout_length=32, total_steps=total_steps, n_minibatches=4, learning_rate=lr, **ppo),
        eval=EvalConfig(every_steps=every or total_steps, n_envs=32, max_episode_length=200),
    )


def test_the_lqr_teacher_solves_the_full_state_task():
    assert evaluate(make("cartpole_no_velocity", full_observation=True), lqr_teacher(), n_envs=16,
                    max_episode_length=200)["eval/episode_return"] == 200.0


@pytest.mark.parametrize("sampler", ["tanh", "categorical"])
def test_extras_for_actions_scores_the_given_actions(sampler):
    """Replaying with the extras of the network's own actions reproduces the
    rollout's log-likelihoods (episode resets inside the rollout, an LSTM)."""
    env = make("cartpole_no_velocity", episode_length=5) if sampler == "tanh" else make("cue_memory", delay=2)
    net = make_actor_critic_for_env(env, "lstm", nnx.Rngs(3), hidden_size=8)
    fn = NetworkFn.of(net)
    carry, fn = fn.initialize(4)
    states = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 4))
    start = RolloutState(env_state=states, carry=carry, episode_return=jnp.zeros(4),
                         episode_length=jnp.zeros(4, jnp.int32), fresh=jnp.ones(4, bool))
    traj = jax.jit(
        lambda fn, start: collect_rollout(env, fn, start, jax.random.key(1), 12, False).trajectory
    )(fn, start)
    assert bool(jnp.any(traj.reset[1:]))
    rebuilt = dataclasses.replace(traj, extras=extras_for_actions(net, traj.extras, traj.actions))
    replayed = jax.jit(lambda fn, t: fn.replay(t).output.loglikelihoods)(fn, rebuilt)
    np.testing.assert_allclose(replayed, traj.loglikelihoods, atol=2e-3 if sampler == "tanh" else 1e-6)


def test_extras_for_actions_follows_maps_and_names_what_it_cannot_read():
    rngs = nnx.Rngs(0)
    port = Sequential(Dense(3, 4, rngs), Map(a=CategoricalSampler(rngs), b=CategoricalSampler(rngs)))
    extras = ((), {"a": jnp.zeros(2, jnp.int32), "b": jnp.zeros(2, jnp.int32)})
    out = extras_for_actions(port, extras, {"a": jnp.array([1, 0]), "b": jnp.array([0, 1])})
    np.testing.assert_array_equal(out[1]["a"], [1, 0])
    with pytest.raises(TypeError, match="cannot find the action samplers inside Dense"):
        extras_for_actions(Dense(3, 4, rngs), (), jnp.zeros(2))


def test_replay_is_exact_and_the_teacher_is_untouched():
    env = make("cartpole_no_velocity", full_observation=True, episode_length=20)  # resets inside rollouts
    teacher = lqr_teacher()
    before = jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param))
    student = make_actor_critic_for_env(env, "lstm", nnx.Rngs(1), hidden_size=8)
    logs = []
    result = train_distillation(env, teacher, student,
                                dataclasses.replace(config(4096), eval=EvalConfig(enabled=False)),
                                log_fn=lambda m, s: logs.append(m))
    assert result.total_steps == 4096
    errors = [m["replay/max_error"] for m in logs]
    assert max(errors) < 1e-5, errors
    assert logs[-1]["loss/distillation"] < logs[0]["loss/distillation"]
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param)))


def test_full_teacher_mixing_executes_the_teachers_actions():
    """beta = 1: every executed action is the teacher's, so training episodes
    last the whole 200 steps from the first iteration on, whatever the student does."""
    env = make("cartpole_no_velocity", full_observation=True)
    student = make_actor_critic_for_env(env, "mlp", nnx.Rngs(1), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    logs = []
    train_distillation(env, lqr_teacher(), student,
                       dataclasses.replace(config(32 * 32 * 8), eval=EvalConfig(enabled=False)),
                       distillation=DistillationConfig(teacher_mixing=1.0), log_fn=lambda m, s: logs.append(m))
    ended = [m for m in logs if m["train/completed_episodes"] > 0]
    assert ended and all(m["train/episode_return"] == 200.0 for m in ended)
    assert all(m["distill/teacher_mixing"] == 1.0 for m in logs)


def test_mismatched_teacher_is_a_named_error():
    env = make("cartpole_no_velocity", full_observation=True)
    discrete = make_actor_critic_for_env(make("cue_memory"), "mlp", nnx.Rngs(0))
    student = make_actor_critic_for_env(env, "mlp", nnx.Rngs(1))
    with pytest.raises(ValueError, match="teacher cannot run on the env's observations"):
        train_distillation(env, discrete, student, config(1024))
    with pytest.raises(ValueError, match="teacher_mixing must be in"):
        DistillationConfig(teacher_mixing=1.5)


def test_a_privileged_teacher_teaches_memory_to_an_lstm_but_not_to_an_mlp():
    """The teacher reads the full state (velocities included); the students
    see positions only. An LSTM student infers velocities from the history and
    matches the teacher (200); the best memoryless policy drops the pole
    before the time limit in most episodes (about 100)."""
    env = make("cartpole_no_velocity")
    full_state = lambda env_state: env_state.data  # [x, x_dot, theta, theta_dot]
    finals = {}
    for arch, seed in (("lstm", 0), ("lstm", 1), ("mlp", 0)):
        kwargs = {"hidden_size": 32} if arch == "lstm" else {}
        student = make_actor_critic_for_env(env, arch, nnx.Rngs(seed), **kwargs)
        result = train_distillation(env, lqr_teacher(), student,
                                    dataclasses.replace(config(32_768), seed=seed), teacher_obs=full_state)
        finals[arch, seed] = result.eval_history[-1][1]["eval/episode_return"]
    # Measured: the LSTM students reach 200 by 17k steps (seeds 0, 1); the MLP ends near 100-130.
    assert finals["lstm", 0] >= 190 and finals["lstm", 1] >= 190, finals
    assert finals["mlp", 0] < 170, finals


@pytest.mark.slow
def test_a_trained_mlp_teacher_distills_into_an_lstm_student():
    """The CartPole preset's MLP, trained with PPO, distilled into an LSTM:
    the student reaches at least 95% of the teacher's return (2 seeds)."""
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.presets import get_preset

    preset = get_preset("gymnax:CartPole-v1", "mlp")
    train_env, eval_env = preset.make_envs()
    teacher = preset.build_network(eval_env, seed=0)
    train_ppo(train_env, teacher, preset.config, eval_env=eval_env)
    teacher_return = evaluate(eval_env, teacher, n_envs=32, max_episode_length=500)["eval/episode_return"]
    for seed in (0, 1):
        student = make_actor_critic_for_env(eval_env, "lstm", nnx.Rngs(seed), hidden_size=32)
        distill = TrainConfig(
            ppo=PPOConfig(n_envs=32, rollout_length=32, total_steps=131_072, n_minibatches=4, learning_rate=3e-3),
            eval=EvalConfig(every_steps=131_072, n_envs=32, max_episode_length=500), seed=seed)
        result = train_distillation(train_env, teacher, student, distill, eval_env=eval_env)
        student_return = result.eval_history[-1][1]["eval/episode_return"]
        assert student_return >= 0.95 * teacher_return, (seed, student_return, teacher_return)


# --- the hooks: target_fn, stop_fn, initial_eval ------------------------------------------------------------


def two_action_teacher() -> PPOAdapter:
    """The LQR controller on action dim 0 of a two-dim action (dim 1: mean 0)."""
    rngs = nnx.Rngs(0)
    head = Dense(4, 4, rngs)  # means (2), then std pre-activations (2)
    head.kernel[...] = jnp.stack([K, jnp.zeros(4), jnp.zeros(4), jnp.zeros(4)], axis=1)
    return PPOAdapter(action=Sequential(head, NormalTanhSampler(rngs)), value=Dense(4, 1, rngs))


def tiny(total_steps, **eval_kwargs):
    return TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=16, total_steps=total_steps, n_minibatches=2,
                                     learning_rate=3e-3),
                       eval=EvalConfig(**{"n_envs": 4, "max_episode_length": 20, **eval_kwargs}))


def tiny_student(env, seed=1):
    return make_actor_critic_for_env(env, "mlp", nnx.Rngs(seed), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))


def test_target_fn_distills_part_of_a_larger_teachers_action():
    """target_fn picks the teacher's first action dim for a one-dim student;
    with beta = 1 the executed action is target_fn's, the LQR controller's,
    so every training episode lasts the whole 200 steps."""
    env = make("cartpole_no_velocity", full_observation=True)
    with pytest.raises(ValueError, match=r"teacher actions .* do not match the student's .* or a target_fn"):
        train_distillation(env, two_action_teacher(), tiny_student(env), tiny(1024))
    with pytest.raises(ValueError, match=r"target_fn\(teacher actions\) .* do not match the student's"):
        train_distillation(env, two_action_teacher(), tiny_student(env), tiny(1024), target_fn=lambda a: a)
    logs = []
    train_distillation(env, two_action_teacher(), tiny_student(env), tiny(8 * 16 * 30, enabled=False),
                       distillation=DistillationConfig(teacher_mixing=1.0), target_fn=lambda a: a[:1],
                       log_fn=lambda m, s: logs.append(m))
    ended = [m for m in logs if m["train/completed_episodes"] > 0]
    assert ended and all(m["train/episode_return"] == 200.0 for m in ended)
    assert logs[-1]["loss/distillation"] < logs[0]["loss/distillation"]
    assert max(m["replay/max_error"] for m in logs) < 1e-5


def test_target_fn_scores_the_mapped_actions():
    """The student is trained on target_fn's actions: distilling the negated
    teacher drives the student's mean action to the opposite sign of the
    teacher's, and its loss on the teacher's own actions rises."""
    env = make("cartpole_no_velocity", full_observation=True)
    student = tiny_student(env)
    train_distillation(env, lqr_teacher(), student, tiny(8 * 16 * 30, enabled=False), target_fn=lambda a: -a)
    obs = jax.random.uniform(jax.random.key(0), (64, 4), minval=-0.3, maxval=0.3)

    def mean(net):
        net.eval()
        return net(net.initialize_state(64), obs).output.actions

    teacher_action, student_action = mean(lqr_teacher()), mean(student)
    assert float(jnp.mean(teacher_action * student_action)) < 0


def test_stop_fn_stops_between_iterations_and_keeps_the_state():
    env = make("cartpole_no_velocity", full_observation=True)
    student = tiny_student(env)
    calls = []

    def stop_fn(metrics, env_steps):
        calls.append((env_steps, metrics))
        return env_steps >= 3 * 128

    result = train_distillation(env, lqr_teacher(), student, tiny(100 * 128, every_steps=256), stop_fn=stop_fn)
    assert [s for s, _ in calls] == [128, 256, 384]
    assert result.total_steps == 384 and int(result.state.iteration) == 3
    assert all("loss/distillation" in m for _, m in calls)
    # evaluations after the first call (128) and 256 steps later (384)
    assert [("eval/episode_return" in m) for _, m in calls] == [True, False, True]
    trained, fresh = (jax.tree.leaves(nnx.state(net, nnx.Param)) for net in (student, tiny_student(env)))
    assert any(not np.array_equal(a, b) for a, b in zip(trained, fresh))  # the student holds the 3 iterations
    # should_stop still works beside it
    result = train_distillation(env, lqr_teacher(), tiny_student(env), tiny(100 * 128, enabled=False),
                                stop_fn=lambda m, s: m["loss/distillation"] < 0, should_stop=lambda: True)
    assert result.total_steps == 128


def test_initial_eval_evaluates_the_student_before_the_first_update():
    env = make("cartpole_no_velocity", full_observation=True)
    logs, evaluated = [], []
    result = train_distillation(env, lqr_teacher(), tiny_student(env), tiny(2 * 128, enabled=False),
                                initial_eval=True, log_fn=lambda m, s: logs.append((s, m)),
                                on_evaluation=lambda policy, s: evaluated.append(s))
    assert logs[0][0] == 0 and "eval/episode_return" in logs[0][1]
    assert all("eval/episode_return" not in m for _, m in logs[1:])  # periodic evaluation is off
    assert [s for s, _ in result.eval_history] == [0] and evaluated == [0]
    assert result.eval_history[0][1] == logs[0][1]
    # the same untrained student evaluated as the trainer's evaluations do, at step 0: the same numbers
    again = train_distillation(env, lqr_teacher(), tiny_student(env), tiny(128, every_steps=128), initial_eval=True)
    assert [s for s, _ in again.eval_history] == [0, 128]
    assert again.eval_history[0][1] == result.eval_history[0][1]


def test_initial_eval_is_the_first_row_of_a_run_directory(tmp_path):
    """With run_dir, the evaluation before the first update is metrics.jsonl's
    first row (env step 0), as log_fn sees it."""
    from nnx_ppo import runner as rd

    env = make("cartpole_no_velocity", full_observation=True)
    logs = []
    train_distillation(env, lqr_teacher(), tiny_student(env), tiny(128, enabled=False), initial_eval=True,
                       log_fn=lambda m, s: logs.append((s, m)), run_dir=tmp_path / "run")
    rows = rd.read_metrics(tmp_path / "run")
    assert rows[0]["env_steps"] == 0 and rows[0]["eval"] and "eval/episode_return" in rows[0]
    assert logs[0][0] == 0 and rows[0]["eval/episode_return"] == pytest.approx(logs[0][1]["eval/episode_return"])
    assert [s for s, m in logs if "eval/episode_return" in m] == [0]  # logged once


@pytest.mark.parametrize("initial_eval", [False, True])
def test_distillation_trains_on_an_accelerator_where_its_initial_state_is_built_once(monkeypatch, initial_eval):
    """Distillation's initial state sets the student's modes and may evaluate
    the student (side effects), so the training program is not compiled
    ahead from its shapes (``Algorithm.shapes_ahead``) even where PPO's is:
    as on an accelerator, it trains as on a CPU."""
    from nnx_ppo.algorithms import trainer

    env = make("cartpole_no_velocity", full_observation=True)
    results = []
    for beside in (True, False):
        monkeypatch.setattr(trainer, "compiles_beside_training", lambda beside=beside: beside)
        student = make_actor_critic_for_env(env, "mlp", nnx.Rngs(1), actor_hidden_sizes=(8,),
                                            critic_hidden_sizes=(8,))
        logs = []
        train_distillation(env, lqr_teacher(), student,
                           dataclasses.replace(config(32 * 32 * 2), eval=EvalConfig(enabled=False)),
                           initial_eval=initial_eval,
                           log_fn=lambda m, s, logs=logs: logs.append(
                               {k: v for k, v in m.items() if not k.startswith("time/")}))
        results.append((logs, jax.tree.leaves(nnx.state(student, nnx.Param))))
    assert results[0][0] == results[1][0] and len(results[0][0]) >= 2
    for a, b in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
