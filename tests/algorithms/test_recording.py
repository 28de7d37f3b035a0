"""Activation recording (nnx_ppo.algorithms.evaluation): shapes, values against
stepping the network by hand, episode boundaries, the network left as it
was, errors, the .npz round trip and ``nnx-ppo eval --record-activations``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.evaluation import Recording, module_paths, record_activations, run_episodes
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.envs.types import EnvState
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_recurrent_actor_critic
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.noise import GaussianNoise
from nnx_ppo.networks.sampling_layers import NormalTanhSampler
from nnx_ppo.networks.types import select_where

B, T = 3, 14
ACTION = "layers/1/components/action"
LSTM = f"{ACTION}/layers/1"
SAMPLER = f"{ACTION}/layers/3"


class Countdown:
    """obs = [steps taken, episode length]; each episode lasts 2..4 steps
    (drawn at reset, so envs end at different times); reward = sum of the action."""

    def reset(self, key):
        zero = jnp.zeros((), jnp.float32)
        length = jax.random.randint(key, (), 2, 5).astype(jnp.float32)
        return EnvState(obs=jnp.stack([zero, length]), reward=zero, done=zero, info={"truncated": zero})

    def step(self, state, action):
        steps, length = state.obs[0] + 1.0, state.obs[1]
        done = (steps >= length).astype(jnp.float32)
        return EnvState(obs=jnp.stack([steps, length]), reward=jnp.sum(action), done=done,
                        info={"truncated": jnp.zeros((), jnp.float32)})


def lstm_net():
    return make_recurrent_actor_critic(2, 1, nnx.Rngs(0), hidden_size=4, encoder_sizes=(4,))


@pytest.fixture(scope="module")
def recorded():
    net = lstm_net()
    return net, record_activations(Countdown(), net, [LSTM, SAMPLER, ACTION], n_envs=B, n_steps=T, seed=3)


def test_module_paths_name_every_stateful_module_parents_first():
    paths = module_paths(lstm_net())
    assert paths[:3] == ["layers/0", "layers/1", ACTION]
    assert LSTM in paths and SAMPLER in paths and "layers/1/components/value/layers/1" in paths
    assert "" not in paths and not any(p.endswith(("m2", "mean")) for p in paths)  # Normalizer's nnx.Lists
    with pytest.raises(TypeError, match="StatefulModule"):
        module_paths(nnx.Linear(1, 1, rngs=nnx.Rngs(0)))


def test_shapes_are_time_then_batch(recorded):
    _, rec = recorded
    assert list(rec.activations) == [LSTM, SAMPLER, ACTION]
    assert rec.activations[LSTM].shape == (T, B, 4)
    assert rec.activations[SAMPLER]["action"].shape == (T, B, 1)
    assert rec.activations[SAMPLER]["log_likelihood"].shape == (T, B)
    assert rec.carries[LSTM][0].shape == (T, B, 4) and rec.carries[LSTM][1].shape == (T, B, 4)
    assert SAMPLER not in rec.carries  # no carry
    # The Sequential's carry holds its LSTM's.
    np.testing.assert_array_equal(rec.carries[ACTION][1][0], rec.carries[LSTM][0])
    assert rec.observations.shape == (T, B, 2) and rec.actions.shape == (T, B, 1)
    assert rec.rewards.shape == (T, B) and rec.done.shape == (T, B) and rec.episode_start.shape == (T, B)
    assert rec.done.dtype == bool and rec.episode_start.dtype == bool
    assert repr(rec).startswith(f"Recording(T={T}, B={B}, ") and "(14, 3, 4)" in repr(rec)


def test_episode_boundaries_match_the_env_resets(recorded):
    _, rec = recorded
    steps, length = rec.observations[..., 0], rec.observations[..., 1]
    np.testing.assert_array_equal(rec.episode_start, steps == 0)        # a reset obs starts every episode
    np.testing.assert_array_equal(rec.done, steps + 1 == length)        # and the env ended the previous one
    assert rec.done.sum() >= B * 2 and not np.all(rec.done[:, 0] == rec.done[:, 1])
    for b in range(B):
        for s in rec.episodes(b):
            assert rec.episode_start[s.start, b] and not rec.episode_start[s.start + 1:s.stop, b].any()
            assert s.stop == T or rec.done[s.stop - 1, b]
    with pytest.raises(ValueError, match="env must be in"):
        rec.episodes(B)


def test_values_equal_stepping_the_network_by_hand(recorded):
    """The LSTM's output and carry, and the actions, at every step equal a
    hand-run of the deterministic network on the recorded observations, with
    the carry reset where an episode starts."""
    net, rec = recorded
    hand = NetworkFn.of(net, deterministic=True).module()
    normalizer, action = hand.layers[0], hand.layers[1].components["action"]
    carry = hand.initialize_state(B)
    for t in range(T):
        carry = select_where(jnp.asarray(rec.episode_start[t]), hand.reset_state(carry), carry)
        obs = jnp.asarray(rec.observations[t])
        x = normalizer(carry[0], obs).output
        x = action.layers[0](carry[1]["action"][0], x).output
        lstm = action.layers[1](carry[1]["action"][1], x)
        np.testing.assert_allclose(rec.activations[LSTM][t], lstm.output, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rec.carries[LSTM][1][t], lstm.next_state[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rec.carries[LSTM][0][t], lstm.next_state[0], rtol=1e-5, atol=1e-6)
        out = hand(carry, obs)
        np.testing.assert_allclose(rec.actions[t], out.output.actions, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rec.activations[SAMPLER]["action"][t], out.output.actions, rtol=1e-5, atol=1e-6)
        carry = out.next_state


def test_first_episodes_are_the_ones_evaluation_runs(recorded):
    net, rec = recorded
    episodes = jax.jit(lambda n, k: run_episodes(Countdown(), n, k, B, T))(NetworkFn.of(net, True), jax.random.key(3))
    first = np.array([rec.rewards[rec.episodes(b)[0], b].sum() for b in range(B)])
    np.testing.assert_allclose(first, episodes.returns, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal([rec.episodes(b)[0].stop for b in range(B)], episodes.lengths)


def test_the_network_and_its_training_graphdef_are_unchanged():
    net = lstm_net()
    sampler = net.layers[1].components["action"].layers[3]
    graphdef, state = nnx.split(net)
    training_graphdef = NetworkFn.of(net, deterministic=False).graphdef
    record_activations(Countdown(), net, [LSTM, ACTION, "layers/0"], n_envs=2, n_steps=3)
    assert NetworkFn.of(net, deterministic=False).graphdef == training_graphdef
    after_graphdef, after_state = nnx.split(net)
    assert after_graphdef == graphdef
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), state, after_state))
    assert net.layers[1].components["action"].layers[3] is sampler and sampler.deterministic is False
    assert all(type(m).__module__.startswith(("nnx_ppo.networks", "flax")) for _, m in nnx.iter_modules(net))


def test_population_graph_connections_are_recordable():
    """A graph's connection transforms are modules: the recurrent h->h
    projection at step t is its Dense applied to h from step t - 1 (the
    graph's delay buffer, in the graph's recorded carry)."""
    from nnx_ppo.networks.graph import PopulationGraph
    from nnx_ppo.networks.utils import Flattener

    rngs = nnx.Rngs(0)
    graph = PopulationGraph(rngs)
    graph.add_input("a", 2)
    graph.add_population("h", 3)
    graph.add_output("o", 3)
    graph.connect("a", "h")
    graph.connect("h", "h", delay=1)
    graph.connect("h", "o", delay=1)
    graph.finalize()
    net = Sequential([graph, Flattener(), PPOAdapter(action=Sequential([Dense(3, 2, rngs), NormalTanhSampler(rngs)]),
                                                     value=Dense(3, 1, rngs))])
    recurrent = "layers/0/transforms/h->h"
    assert recurrent in module_paths(net)
    rec = record_activations(Countdown(), net, ["layers/0", recurrent], n_envs=2, n_steps=6)
    h = rec.carries["layers/0"]["buffers"]["h"][:, :, -1]  # [T, B, 3]: h at each step
    for t in range(1, 6):
        previous = np.where(rec.episode_start[t][:, None], 0.0, h[t - 1])  # a reset zeroes the buffer
        expected = graph.transforms["h->h"]((), jnp.asarray(previous, jnp.float32)).output
        np.testing.assert_allclose(rec.activations[recurrent][t], expected, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named_errors():
    net, env = lstm_net(), Countdown()
    with pytest.raises(ValueError, match=r"unknown module path 'layers/9'.*'layers/1/components/action/layers/1'"):
        record_activations(env, net, ["layers/9"], n_steps=2)
    with pytest.raises(ValueError, match="paths is empty"):
        record_activations(env, net, [], n_steps=2)
    with pytest.raises(TypeError, match="must be strings"):
        record_activations(env, net, [("layers", 0)], n_steps=2)
    with pytest.raises(TypeError, match="network must be a StatefulModule"):
        record_activations(env, nnx.Linear(1, 1, rngs=nnx.Rngs(0)), LSTM, n_steps=2)
    with pytest.raises(ValueError, match="n_steps must be a positive int, got 0"):
        record_activations(env, net, LSTM, n_steps=0)


def test_npz_round_trip_with_key_carries_and_sampling(tmp_path):
    """A noise layer's per-env PRNG keys and pytree outputs survive save/load;
    ``deterministic=False`` turns the noise on."""
    rngs = nnx.Rngs(1)
    action = Sequential([Dense(2, 2, rngs), NormalTanhSampler(rngs)])
    net = Sequential([GaussianNoise(0.5, rngs), PPOAdapter(action=action, value=Dense(2, 1, rngs))])
    rec = record_activations(Countdown(), net, ["layers/0", "layers/1/components/action"], n_envs=2, n_steps=5,
                             deterministic=False)
    noise = rec.activations["layers/0"] - rec.observations
    assert noise.shape == (5, 2, 2) and np.all(np.abs(noise) > 0)
    keys = rec.carries["layers/0"]
    assert jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) and keys.shape == (5, 2)

    path = tmp_path / "sub" / "rec.npz"
    rec.save(path)
    keys = set(np.load(path).files)
    assert {"activations/layers/0", "carries/layers/0", "observations", "done", "episode_start",
            "activations/layers/1/components/action/action"} <= keys
    back = Recording.load(path)
    assert jax.tree.structure(back.activations) == jax.tree.structure(rec.activations)
    assert jax.tree.structure(back.carries) == jax.tree.structure(rec.carries)
    np.testing.assert_array_equal(back.activations["layers/0"], rec.activations["layers/0"])
    np.testing.assert_array_equal(jax.random.key_data(back.carries["layers/0"]),
                                  jax.random.key_data(rec.carries["layers/0"]))
    for name in ("observations", "actions", "rewards", "done", "episode_start"):
        np.testing.assert_array_equal(getattr(back, name), getattr(rec, name))
    with pytest.raises(ValueError, match="must end in .npz"):
        rec.save(tmp_path / "rec.npy")


def test_cli_eval_records_activations(tmp_path, capsys):
    from nnx_ppo import cli

    run = tmp_path / "run"
    assert cli.main(["train", "--network", "lstm", "--hidden-size", "4", "--ppo.n-envs", "4",
                     "--ppo.n-minibatches", "1", "--ppo.rollout-length", "8", "--ppo.n-epochs", "1",
                     "--ppo.total-steps", "32", "--eval.n-envs", "2", "--eval.max-episode-length", "12",
                     "--eval.every-steps", "1000000", "--run-dir", str(run), "--quiet"]) == 0
    capsys.readouterr()

    assert cli.main(["eval", str(run), "--list-modules"]) == 0
    listed = capsys.readouterr().out
    assert LSTM in listed and "LSTM" in listed

    out = tmp_path / "act.npz"
    assert cli.main(["eval", str(run), "--episodes", "2", "--record-activations", LSTM, "layers/0",
                     "--out", str(out)]) == 0
    assert "activations:" in capsys.readouterr().out
    rec = Recording.load(out)
    assert rec.activations[LSTM].shape == (12, 2, 4) and rec.activations["layers/0"].shape[:2] == (12, 2)
    assert rec.done.shape == (12, 2)

    assert cli.main(["eval", str(run), "--record-activations", "layers/9", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown module path 'layers/9'" in err and LSTM in err
    assert cli.main(["eval", str(run), "--record-activations", LSTM]) == 2
    assert "needs --out" in capsys.readouterr().err
