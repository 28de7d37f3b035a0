"""Checkpointing: round trips, resuming, atomic writes, pruning, inference loading, errors."""

import dataclasses
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms import checkpointing
from nnx_ppo.algorithms.checkpointing import (
    CheckpointError,
    latest_checkpoint,
    load_config,
    load_metadata,
    restore_network,
    restore_training_state,
    save_training_state,
)
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_mlp_actor_critic
from nnx_ppo.networks.noise import GaussianNoise
from tests.algorithms.toy_envs import Target

N_ENVS, T = 4, 4
STEPS_PER_ITERATION = N_ENVS * T


def _config(iterations, **kwargs):
    return TrainConfig(
        ppo=PPOConfig(n_envs=N_ENVS, rollout_length=T, total_steps=iterations * STEPS_PER_ITERATION,
                      n_epochs=1, n_minibatches=2),
        eval=EvalConfig(enabled=False),
        **kwargs,
    )


def _noisy_net(seed=0, hidden=8):
    """Normalizer statistics, RNG streams and per-env keys in the carry."""
    return Sequential([
        GaussianNoise(0.1, nnx.Rngs(seed + 100)),
        make_mlp_actor_critic(3, 2, (hidden,), (hidden,), nnx.Rngs(seed)),
    ])


def _is_key(x):
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _plain(x):
    return jax.random.key_data(x) if _is_key(x) else x


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        name = jax.tree_util.keystr(path)
        assert x.dtype == y.dtype, name
        if _is_key(x):
            assert str(jax.random.key_impl(x)) == str(jax.random.key_impl(y)), name
        np.testing.assert_array_equal(np.asarray(_plain(x)), np.asarray(_plain(y)), err_msg=name)


def _leaves_named(tree, fragment):
    return [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
            if fragment in jax.tree_util.keystr(path)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short training run (2 iterations, a checkpoint after each)."""
    run_dir = tmp_path_factory.mktemp("run")
    net = _noisy_net()
    config = _config(2, checkpoint_every_steps=STEPS_PER_ITERATION)
    result = train_ppo(Target(), net, config, checkpoint_dir=str(run_dir), checkpoint_metadata={"note": "toy"})
    return run_dir, net, config, result


def test_round_trip_restores_every_kind_of_variable(trained, tmp_path):
    _, _, config, result = trained
    state = result.state
    # Every kind of state is present and non-trivial after training.
    assert int(state.iteration) == 2
    assert _is_key(state.key)
    assert any(_is_key(leaf) for leaf in jax.tree.leaves(state.rollout.carry))
    assert any(_is_key(leaf) for leaf in jax.tree.leaves(state.rollout.env_state))
    assert any(_is_key(leaf) for leaf in _leaves_named(state.rest, "'key'"))
    assert all(int(c) > 0 for c in _leaves_named(state.rest, "rngs']['default']['count'"))
    assert float(_leaves_named(state.rest, "['count']")[-1]) > 0  # normalizer samples seen
    assert [int(c) for c in _leaves_named(state.opt_state, ".count")] == [4]  # 2 iterations x 2 minibatches

    path = save_training_state(tmp_path, state, config, step=123, metadata={"a": [1, 2]})
    assert path == tmp_path / "step_000000000123"
    template = new_training_state(Target(), _noisy_net(seed=5), config)
    restored = restore_training_state(tmp_path, template)
    _assert_trees_equal(state, restored)
    # Also through the checkpoint directory itself.
    _assert_trees_equal(state, restore_training_state(path, template))
    assert load_config(tmp_path) == config
    assert load_metadata(path) == {"a": [1, 2]}


def test_periodic_checkpoints_are_written_with_metadata(trained):
    run_dir, _, config, result = trained
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["step_000000000016", "step_000000000032"]
    assert latest_checkpoint(run_dir) == run_dir / "step_000000000032"
    assert load_metadata(run_dir) == {"note": "toy"}
    assert load_config(run_dir) == config
    restored = restore_training_state(run_dir, new_training_state(Target(), _noisy_net(seed=3), config))
    _assert_trees_equal(result.state, restored)


def test_restored_state_runs_the_program_compiled_for_a_fresh_one(trained):
    """A restored state has the fresh state's signature (arrays not committed
    to a device, like the template's): the training program compiled for a
    fresh state runs it without compiling again (a persistent compilation
    cache finds the program compiled for the fresh run)."""
    from nnx_ppo.algorithms.functional import NetworkFn, donatable
    from nnx_ppo.algorithms.ppo import make_train_fn
    from nnx_ppo.envs import as_env

    run_dir, _, config, _ = trained
    net = _noisy_net(seed=4)
    fresh = new_training_state(Target(), net, config)
    restored = restore_training_state(run_dir, new_training_state(Target(), _noisy_net(seed=6), config))
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(fresh)[0], jax.tree.leaves(restored)):
        if isinstance(a, jax.Array):
            assert _plain(b).committed == _plain(a).committed, jax.tree_util.keystr(path)
    train = make_train_fn(as_env(Target()), NetworkFn.of(net, deterministic=False).graphdef, config.ppo, 1)
    n = jnp.asarray(1, jnp.int32)
    train(donatable(fresh), n)
    state, _ = train(donatable(restored), n)
    assert train._cache_size() == 1
    assert int(state.iteration) == 3


def _recorder():
    rows = []
    return rows, lambda metrics, steps: rows.append((steps, dict(metrics)))


def _without_timing(rows):
    return [(s, {k: v for k, v in m.items() if not k.startswith("time/")}) for s, m in rows]


def test_resume_matches_an_uninterrupted_run(trained):
    run_dir, _, _, _ = trained  # 2 iterations done, checkpointed
    total = 4
    # Resume in a fresh network (another init seed) from the checkpoint at 2 iterations.
    resumed_net = _noisy_net(seed=9)
    resumed_rows, log_resumed = _recorder()
    resumed = train_ppo(Target(), resumed_net, _config(total), resume_from=str(run_dir), log_fn=log_resumed)
    assert resumed.total_iterations == total

    full_net = _noisy_net()
    full_rows, log_full = _recorder()
    full = train_ppo(Target(), full_net, _config(total), log_fn=log_full)

    _assert_trees_equal(full.state, resumed.state)
    for a, b in zip(jax.tree.leaves(nnx.state(full_net)), jax.tree.leaves(nnx.state(resumed_net))):
        np.testing.assert_array_equal(np.asarray(_plain(a)), np.asarray(_plain(b)))
    assert [s for s, _ in resumed_rows] == [48, 64]
    assert _without_timing(resumed_rows) == _without_timing(full_rows[-2:])


def _small_state(config):
    return new_training_state(Target(), _noisy_net(), config)


def test_interrupted_writes_are_never_picked(tmp_path):
    config = _config(1)
    state = _small_state(config)
    save_training_state(tmp_path, state, config, step=16)
    good = save_training_state(tmp_path, state, config, step=32)
    # A write that never finished: orbax's temporary directory, never renamed into place.
    from orbax.checkpoint.path import atomicity

    unfinished = tmp_path / f"step_000000000048{atomicity.TMP_DIR_SUFFIX}"
    shutil.copytree(good, unfinished)
    assert latest_checkpoint(tmp_path) == good
    _assert_trees_equal(state, restore_training_state(tmp_path, _small_state(config)))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint.*interrupted"):
        restore_training_state(unfinished, _small_state(config))


def test_failed_save_leaves_no_checkpoint(tmp_path, monkeypatch):
    config = _config(1)
    state = _small_state(config)
    good = save_training_state(tmp_path, state, config, step=16)

    def crash(self, directory, *args, **kwargs):  # inside orbax's temporary directory, before any item is complete
        (directory / "network").mkdir(parents=True, exist_ok=True)
        (directory / "network" / "partial").write_text("half written")
        raise KeyboardInterrupt("simulated crash")

    import orbax.checkpoint as ocp

    monkeypatch.setattr(ocp.CompositeCheckpointHandler, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_training_state(tmp_path, state, config, step=32)
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(TypeError, match="JSON"):
        save_training_state(tmp_path, state, config, step=48, metadata={"f": object()})
    assert latest_checkpoint(tmp_path) == good


def test_keeps_only_the_last_k(tmp_path):
    config = _config(1)
    state = _small_state(config)
    for step in (16, 32, 48, 64):
        save_training_state(tmp_path, state, config, step=step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000000048", "step_000000000064"]
    assert [s for s, _ in checkpointing.list_checkpoints(tmp_path)] == [48, 64]
    # Re-saving an existing step replaces it.
    save_training_state(tmp_path, state, config, step=64, keep=2)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000000000064"


def test_load_network_for_inference(tmp_path):
    from nnx_ppo import envs
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    spec = {"env": "gymnax:CartPole-v1", "kind": "mlp", "seed": 0,
            "kwargs": {"actor_hidden_sizes": [8], "critic_hidden_sizes": [8]}}
    env = envs.make(spec["env"])

    def build(seed):
        return make_actor_critic_for_env(env, "mlp", nnx.Rngs(seed), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))

    # Stand-in for training (compiling a training run is slow on small machines):
    # move every float parameter and normalizer statistic away from its initial value.
    net = build(0)
    config = _config(1)
    state = new_training_state(env, net, config)

    def shift(tree, seed):
        leaves, treedef = jax.tree.flatten(tree)
        keys = jax.random.split(jax.random.key(seed), len(leaves))
        leaves = [x + 0.5 * jnp.abs(jax.random.normal(k, x.shape, x.dtype))
                  if jnp.issubdtype(x.dtype, jnp.floating) else x for x, k in zip(leaves, keys)]
        return jax.tree.unflatten(treedef, leaves)

    state = dataclasses.replace(state, params=shift(state.params, 1), rest=shift(state.rest, 2))
    nnx.update(net, state.params, state.rest)
    save_training_state(tmp_path, state, config, step=16, metadata={"network": spec})

    obs = jax.vmap(env.reset)(jax.random.split(jax.random.key(1), N_ENVS)).obs
    net.eval()
    expected = net(net.initialize_state(N_ENVS), obs).output

    import nnx_ppo

    loaded_from_metadata = nnx_ppo.load_network(tmp_path)  # rebuilt from the NetworkSpec in the metadata
    loaded_into = checkpointing.load(tmp_path, network=build(42))  # the short name of restore_network
    for loaded in (loaded_from_metadata, loaded_into):
        assert loaded is not net
        modes = [m.deterministic for _, m in nnx.iter_graph(loaded)
                 if isinstance(m, nnx.Module) and hasattr(m, "deterministic")]
        assert modes and all(modes)
        for a, b in zip(jax.tree.leaves(nnx.state(net, nnx.Param)), jax.tree.leaves(nnx.state(loaded, nnx.Param))):
            np.testing.assert_array_equal(a, b)
        out = loaded(loaded.initialize_state(N_ENVS), obs).output
        np.testing.assert_array_equal(out.actions, expected.actions)
        np.testing.assert_array_equal(out.value_estimates, expected.value_estimates)


def test_load_network_without_metadata_asks_for_a_network(tmp_path):
    config = _config(1)
    save_training_state(tmp_path, _small_state(config), config, step=16)
    import nnx_ppo

    with pytest.raises(ValueError, match="network="):
        nnx_ppo.load_network(tmp_path)
    with pytest.raises(ValueError, match="nnx_ppo.load_network"):
        restore_network(tmp_path, None)
    net = restore_network(tmp_path, network=_noisy_net(seed=4))
    reference = _noisy_net()
    for a, b in zip(jax.tree.leaves(nnx.state(reference, nnx.Param)), jax.tree.leaves(nnx.state(net, nnx.Param))):
        np.testing.assert_array_equal(a, b)


def test_other_architecture_names_the_variable_and_both_shapes(tmp_path):
    config = _config(1)
    save_training_state(tmp_path, _small_state(config), config, step=16)
    wider = new_training_state(Target(), _noisy_net(hidden=16), config)
    with pytest.raises(ValueError, match=r"params/layers/1/.*/bias has shape \(8,\) in the checkpoint "
                                         r"but shape \(16,\) in the template"):
        restore_training_state(tmp_path, wider)
    with pytest.raises(ValueError, match=r"shape \(8,\) in the checkpoint but shape \(16,\)"):
        restore_network(tmp_path, network=_noisy_net(hidden=16))
    without_noise = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    with pytest.raises(ValueError, match="another architecture"):
        restore_network(tmp_path, network=without_noise)


def test_missing_empty_and_corrupt_checkpoints(tmp_path):
    config = _config(1)
    template = _small_state(config)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore_training_state(tmp_path / "nope", template)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        restore_training_state(tmp_path, template)
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "nope") is None

    path = save_training_state(tmp_path / "run", template, config, step=16)
    # Corrupt the stored arrays: wipe every data file of the orbax item.
    for f in (path / "training").rglob("*"):
        if f.is_file() and not f.name.startswith("_CHECKPOINT"):
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=f"{path}.*corrupt"):
        restore_training_state(path, template)

    path2 = save_training_state(tmp_path / "run2", template, config, step=16)
    (path2 / "layout" / "layout.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{path2}.*corrupt.*layout.json"):
        restore_training_state(tmp_path / "run2", template)
    (path2 / "config" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_config(path2)


def test_zero_size_arrays_round_trip(tmp_path):
    """MJX states hold empty buffers (e.g. no contacts); orbax refuses to
    write zero-size arrays, so they are kept in the layout only."""

    class WithEmptyBuffer(Target):
        def reset(self, key):
            s = super().reset(key)
            return dataclasses.replace(s, data={"key": s.data, "contacts": jnp.zeros((0, 3))})

        def step(self, state, action):
            inner = dataclasses.replace(state, data=state.data["key"])
            s = super().step(inner, action)
            return dataclasses.replace(s, data={"key": s.data, "contacts": state.data["contacts"]})

    env = WithEmptyBuffer()
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=16, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    state = new_training_state(env, _noisy_net(), config)
    save_training_state(tmp_path, state, config, step=1)
    restored = restore_training_state(tmp_path, new_training_state(env, _noisy_net(seed=3), config))
    assert restored.rollout.env_state.data["contacts"].shape == (4, 0, 3)
    _assert_trees_equal(state, restored)


def test_resuming_an_older_checkpoint_warns_about_newer_ones(trained, tmp_path):
    run_dir, _, _, _ = trained
    branch = tmp_path / "branch"
    shutil.copytree(run_dir, branch)
    older = sorted(p for p in branch.iterdir() if p.name.startswith("step_"))[0]
    with pytest.warns(UserWarning, match="later checkpoints"):
        train_ppo(Target(), _noisy_net(), _config(2), resume_from=str(older), checkpoint_dir=str(branch))


def test_relative_paths_work_everywhere(tmp_path, monkeypatch):
    """orbax needs absolute paths; every entry point resolves a relative one
    against the working directory (the docs' own ``runs/...`` form)."""
    import nnx_ppo

    monkeypatch.chdir(tmp_path)
    config = _config(1)
    state = _small_state(config)
    saved = save_training_state("runs/rel/checkpoints", state, config, step=16)
    assert saved.is_absolute() and saved.parent == tmp_path / "runs" / "rel" / "checkpoints"
    assert latest_checkpoint("runs/rel/checkpoints") == saved
    restored = restore_training_state("runs/rel/checkpoints", _small_state(config))
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    net = nnx_ppo.load_network("runs/rel/checkpoints", network=_noisy_net())
    for a, b in zip(jax.tree.leaves(nnx.state(net, nnx.Param)), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("field", ["rollout_length", "n_envs"])
def test_resuming_with_another_iteration_size_is_refused_untouched(trained, field):
    """The saved iteration count is in iterations of n_envs x rollout_length
    steps: a change is refused by name before anything is read or written."""
    run_dir, _, _, _ = trained
    before = sorted(p.name for p in pathlib.Path(run_dir).rglob("*"))
    config = _config(4)
    changed = getattr(config.ppo, field) * 2
    config = dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, **{field: changed}))
    with pytest.raises(ValueError, match=f"cannot resume with PPOConfig.{field}={changed}"):
        train_ppo(Target(), _noisy_net(seed=9), config, resume_from=str(run_dir), checkpoint_dir=str(run_dir))
    assert sorted(p.name for p in pathlib.Path(run_dir).rglob("*")) == before


def test_best_evaluated_policy_is_kept(tmp_path):
    """Every evaluation at least as good as the best so far saves the policy
    (parameters and statistics, no optimizer state) under checkpoints/best;
    load_network(step="best") gives the policy of that evaluation, the same
    as the full checkpoint of that step (ties: the latest)."""
    import nnx_ppo

    config = TrainConfig(
        ppo=PPOConfig(n_envs=N_ENVS, rollout_length=T, total_steps=6 * STEPS_PER_ITERATION, n_epochs=1,
                      n_minibatches=2),
        eval=EvalConfig(every_steps=STEPS_PER_ITERATION, n_envs=8, max_episode_length=7),
        checkpoint_every_steps=STEPS_PER_ITERATION, keep_checkpoints=10)
    result = train_ppo(Target(), _noisy_net(), config, checkpoint_dir=str(tmp_path))
    returns = [(steps, m["eval/episode_return"]) for steps, m in result.eval_history]
    assert len(returns) == 6
    best = max(r for _, r in returns)
    best_step = max(steps for steps, r in returns if r == best)
    path = checkpointing.find_checkpoint(tmp_path, "best")
    assert path == checkpointing.best_policy_dir(tmp_path) / f"step_{best_step:012d}"
    assert load_metadata(path)["eval"]["eval/episode_return"] == pytest.approx(best)
    assert (path / "network").is_dir() and not (path / "training").exists()
    kept = nnx_ppo.load_network(tmp_path, _noisy_net(seed=9), step="best")
    at_step = nnx_ppo.load_network(tmp_path, _noisy_net(seed=9), step=best_step)
    _assert_trees_equal(nnx.state(kept), nnx.state(at_step))
    assert checkpointing.find_checkpoint(tmp_path).name == f"step_{6 * STEPS_PER_ITERATION:012d}"  # the final one
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 5 .* saved steps: \\[16, 32"):
        checkpointing.find_checkpoint(tmp_path, 5)


def test_a_checkpoint_of_an_earlier_unreleased_version_is_refused_in_one_line(tmp_path):
    """The layout of earlier, unreleased versions (formats 1 and 2: JSON
    files and a ``COMMITTED`` marker beside ``network/`` and ``training/``,
    written without orbax's CheckpointManager) is not mapped: restoring such
    a checkpoint, or reading its config, fails in one line that says so,
    whether from the run directory or the checkpoint itself."""
    import functools
    import json

    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    save_training_state(tmp_path, new_training_state(Target(), net, _config(1)), _config(1), step=16)
    path = latest_checkpoint(tmp_path)
    layout = json.loads((path / "layout" / "layout.json").read_text())
    assert layout["format"] == checkpointing.FORMAT_VERSION == 3
    # The earlier layout, built around the same orbax items.
    for item in ("layout", "config", "metadata"):
        (path / item / f"{item}.json").rename(path / f"{item}.json")
        shutil.rmtree(path / item)
    (path / "layout.json").write_text(json.dumps({**layout, "format": 2}))
    for orbax_file in ("_CHECKPOINT_METADATA", "commit_success.txt"):
        (path / orbax_file).unlink()
    (path / "COMMITTED").write_text("step 16\n")
    template = new_training_state(Target(), net, _config(1))
    for where in (tmp_path, path):
        for read in (functools.partial(restore_training_state, where, template), functools.partial(load_config, where)):
            with pytest.raises(CheckpointError) as caught:
                read()
            message = str(caught.value)
            assert "\n" not in message and str(path) in message
            assert "was written by an earlier, unreleased version of nnx-ppo" in message and "cannot be read" in message
    with pytest.raises(CheckpointError, match="earlier, unreleased version of nnx-ppo"):
        restore_network(path, make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(5)))
