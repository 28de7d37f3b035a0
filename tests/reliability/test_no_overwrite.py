"""A fresh run never writes into, or prunes, another run's checkpoints."""

import pytest
from flax import nnx

from nnx_ppo import cli
from nnx_ppo.algorithms import checkpointing
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.trainer import CheckpointDirInUseError, train_ppo
from nnx_ppo.networks.factories import make_mlp_actor_critic
from tests.algorithms.toy_envs import Target


def _config(total_steps):
    return TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, n_minibatches=2, total_steps=total_steps),
                       eval=EvalConfig(enabled=False), checkpoint_every_steps=32, keep_checkpoints=2)


def _net():
    return make_mlp_actor_critic(3, 2, rngs=nnx.Rngs(0), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))


def test_a_fresh_run_refuses_a_directory_holding_checkpoints(tmp_path, capsys):
    """train_ppo(checkpoint_dir=D) without resume_from, into a D holding a
    longer run: a named error, and D's checkpoints are untouched (before the
    fix the new run's own checkpoints were pruned in favour of the old run's
    higher steps). The CLI refuses a --run-dir whose checkpoints/ holds
    checkpoints without a config.json (train and sweep alike), before
    writing anything."""
    longer = tmp_path / "longer"
    train_ppo(Target(), _net(), _config(128), checkpoint_dir=str(longer))
    before = [s for s, _ in checkpointing.list_checkpoints(longer)]
    assert before == [96, 128]
    with pytest.raises(CheckpointDirInUseError, match="already holds checkpoints at steps \\[96, 128\\]"):
        train_ppo(Target(), _net(), _config(64), checkpoint_dir=str(longer))
    assert [s for s, _ in checkpointing.list_checkpoints(longer)] == before

    run = tmp_path / "run"
    run.mkdir()
    longer.rename(run / "checkpoints")  # a run's checkpoints, left without their config.json
    assert cli.main(["train", "--ppo.n-envs", "8", "--ppo.total-steps", "128", "--run-dir", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "already holds checkpoints" in err and len(err.strip().splitlines()) == 1, err
    assert not (run / "config.json").exists()
    assert cli.main(["sweep", "--grid", "ppo.learning-rate=1e-3,3e-4", "--run-dir", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err  # nnx-ppo sweep follows the same rule
    assert "already holds checkpoints" in err and len(err.strip().splitlines()) == 1, err
    assert not (run / "config.json").exists()
    assert [s for s, _ in checkpointing.list_checkpoints(run / "checkpoints")] == before
