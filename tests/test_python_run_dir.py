"""``run_dir=`` and ``progress=`` from Python: the trainers write what
``nnx-ppo train`` writes, and the command line reads, resumes and evaluates it.
Budgets are tiny (8 envs, an MLP of width 8, a few iterations)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from nnx_ppo import cli, load_policy
from nnx_ppo import runner as rd
from nnx_ppo.algorithms.population import train_seeds
from nnx_ppo.algorithms.trainer import CheckpointDirInUseError, train_ppo
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_actor_critic_for_env
from nnx_ppo.presets import library_defaults

TINY = ["--network", "mlp", "--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "2",
        "--ppo.rollout-length", "16", "--ppo.n-epochs", "1", "--eval.n-envs", "4", "--eval.max-episode-length", "16",
        "--eval.every-steps", "256", "--checkpoint-every-steps", "256"]
TOTAL = 512  # 4 iterations of 8 x 16 steps

# What differs between two runs of the same training: when and how they were started.
VOLATILE = {"created", "command", "preset", "resumed"}


def _numbers(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    assert cli.main(["train", *TINY, "--ppo.total-steps", str(TOTAL), "--run-dir", str(run), "--quiet"]) == 0
    return run


def _as_the_cli_does(cli_run: Path):
    """The envs, network and config of ``cli_run``, built in Python."""
    saved = rd.read_run_config(cli_run)
    kwargs = saved["env_kwargs"]
    train_env = make(saved["env"], random_initial_steps=True, **kwargs)  # as the CLI trains
    eval_env = make(saved["env"], **kwargs)
    # cue_memory's preset is an LSTM's, so `--network mlp` starts from the library defaults of an MLP
    network = dataclasses.replace(library_defaults(saved["env"], "mlp", 8), env_kwargs=kwargs).network_spec()
    return train_env, eval_env, network, rd.train_config_from_dict(saved["config"])


@pytest.fixture(scope="module")
def python_run(cli_run: Path, tmp_path_factory):
    """``cli_run``'s training, from Python; returns the run and the result."""
    train_env, eval_env, network, config = _as_the_cli_does(cli_run)
    run = tmp_path_factory.mktemp("python") / "run"
    return run, train_ppo(train_env, network, config, eval_env=eval_env, run_dir=run)


def test_python_writes_what_the_cli_writes(cli_run: Path, python_run):
    run, result = python_run

    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in cli_run.iterdir())
    ours, theirs = rd.read_run_config(run), rd.read_run_config(cli_run)
    assert {k: v for k, v in ours.items() if k not in VOLATILE} == {
        k: v for k, v in theirs.items() if k not in VOLATILE}
    # The same training, so the same numbers, row by row.
    assert _numbers(rd.read_metrics(run)) == _numbers(rd.read_metrics(cli_run))
    for sub in ("checkpoints", "checkpoints/best"):
        assert sorted(p.name for p in (run / sub).glob("step_*")) == sorted(
            p.name for p in (cli_run / sub).glob("step_*"))
    assert any((run / "tb").iterdir())
    assert isinstance(result.network, nnx.Module)


def test_the_cli_evaluates_and_resumes_a_python_run(cli_run: Path, python_run, capsys):
    train_env, eval_env, network, _ = _as_the_cli_does(cli_run)
    run, _ = python_run

    assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    assert "4 deterministic episodes" in capsys.readouterr().out
    assert cli.main(["train", "--resume", str(run), "--ppo.total-steps", str(2 * TOTAL), "--quiet"]) == 0
    rows = [r for r in rd.read_metrics(run) if not r.get("eval")]
    assert [r["iteration"] for r in rows] == list(range(1, 9))

    # ... and so does Python, from the run directory itself.
    saved = rd.train_config_from_dict(rd.read_run_config(run)["config"])
    longer = dataclasses.replace(saved, ppo=dataclasses.replace(saved.ppo, total_steps=3 * TOTAL))
    train_ppo(train_env, network, longer, eval_env=eval_env, run_dir=run, resume_from=run)
    rows = [r for r in rd.read_metrics(run) if not r.get("eval")]
    assert [r["iteration"] for r in rows] == list(range(1, 13))
    assert len(rd.read_run_config(run)["resumed"]) == 2


def test_a_fresh_run_refuses_a_run_directory_with_checkpoints(cli_run: Path):
    train_env, eval_env, network, config = _as_the_cli_does(cli_run)
    before = sorted(p.name for p in (cli_run / "checkpoints").glob("step_*"))
    with pytest.raises(CheckpointDirInUseError, match="resume_from"):
        train_ppo(train_env, network, config, eval_env=eval_env, run_dir=cli_run)
    assert sorted(p.name for p in (cli_run / "checkpoints").glob("step_*")) == before
    with pytest.raises(ValueError, match="run_dir or checkpoint_dir"):
        train_ppo(train_env, network, config, run_dir=cli_run, checkpoint_dir=str(cli_run / "checkpoints"))


def test_a_network_object_is_recorded_and_loaded_from_python(cli_run: Path, tmp_path: Path, capsys):
    train_env, eval_env, _, config = _as_the_cli_does(cli_run)
    config = dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, total_steps=256))

    def build(rngs):
        return make_actor_critic_for_env(eval_env, "mlp", rngs, actor_hidden_sizes=[8], critic_hidden_sizes=[8])

    run = tmp_path / "object"
    results = train_seeds(train_env, build, config, [0, 1], eval_env=eval_env, run_dir=run, progress=True)
    saved = rd.read_run_config(run)
    assert saved["seeds"] == [0, 1]
    assert saved["network"] == {"python_class": f"{type(results[0].network).__module__}."
                                                f"{type(results[0].network).__qualname__}"}
    assert {r["seed"] for r in rd.read_metrics(run)} == {0, 1}
    shown = capsys.readouterr()
    assert any("100%" in line and "512/512" in line for line in shown.err.splitlines())  # both seeds' steps

    # The command line cannot rebuild the network: one line saying what to do.
    assert cli.main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "load_policy(run, network=...)" in err
    # Python can, from a network of the same structure.
    policy = load_policy(run, seed=1, network=build(nnx.Rngs(5)))
    carry = policy.initial_carry(3)
    obs = np.zeros((3, *np.shape(eval_env.reset(jax.random.key(0)).obs)), np.float32)
    action, _ = policy(carry, obs)
    assert np.shape(action)[0] == 3
    assert all(r.network is not None for r in results)


def test_an_env_object_and_a_failed_start(tmp_path, capsys):
    """A directory whose start failed (config.json, no checkpoint) is never
    taken over: a fresh run refuses it in one line and leaves it as it was;
    once it is cleared, an env not made by ``make`` is recorded as not
    rebuildable, and the command line says so in one line."""
    from nnx_ppo.envs.tasks import CueMemory
    from nnx_ppo.runner import RunDirInUseError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"env": "cue_memory", "network": {}}')
    env = CueMemory(n_cues=2, delay=2)
    network = make_actor_critic_for_env(env, "mlp", nnx.Rngs(0), actor_hidden_sizes=[8], critic_hidden_sizes=[8])
    config = rd.train_config_from_dict({"ppo": {"n_envs": 8, "rollout_length": 8, "n_minibatches": 2,
                                                "total_steps": 128}, "eval": {"n_envs": 4, "max_episode_length": 6}})
    with pytest.raises(RunDirInUseError, match=r"already holds a run's data \(config.json\)"):
        train_ppo(env, network, config, run_dir=run)
    assert (run / "config.json").read_text() == '{"env": "cue_memory", "network": {}}'
    (run / "config.json").unlink()
    train_ppo(env, network, config, run_dir=run)
    saved = rd.read_run_config(run)
    assert saved["env_rebuildable"] is False and saved["env"] == "python:CueMemory"
    capsys.readouterr()
    assert cli.main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was trained from Python on a network object" in err
