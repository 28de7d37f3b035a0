"""A truncated newest checkpoint: eval, resume and distill fall back to the
newest intact one with a one-line warning naming the skipped one."""

import json
import warnings

import jax
import numpy as np
import pytest
from flax import nnx

from nnx_ppo import cli
from nnx_ppo._app.runs import format_warning
from nnx_ppo.algorithms import checkpointing
from nnx_ppo.algorithms.checkpointing import CheckpointError, CheckpointFallbackWarning
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.networks.factories import make_mlp_actor_critic
from tests.algorithms.toy_envs import Target


def _truncate(checkpoint):
    """Cut every file of a checkpoint's arrays (orbax's data and metadata) to half its length."""
    files = [p for item in ("network", "training") for p in (checkpoint / item).rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def _net(seed=0):
    return make_mlp_actor_critic(3, 2, rngs=nnx.Rngs(seed), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))


def test_restores_fall_back_to_the_newest_intact_checkpoint(tmp_path):
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, n_minibatches=2, total_steps=128),
                         eval=EvalConfig(enabled=False), checkpoint_every_steps=32, keep_checkpoints=2)
    train_ppo(Target(), _net(), config, checkpoint_dir=str(tmp_path))
    (step_96, older), (step_128, newest) = checkpointing.list_checkpoints(tmp_path)
    assert (step_96, step_128) == (96, 128)
    want = checkpointing.restore_network(older, _net(1))  # the one the fallback must give
    _truncate(newest)
    with pytest.raises(CheckpointError):
        checkpointing.restore_network(newest, _net(1))  # asked for by name: no fallback
    with pytest.warns(CheckpointFallbackWarning, match="step_000000000128 .* loaded step_000000000096"):
        got = checkpointing.restore_network(tmp_path, _net(1))
    for a, b in zip(jax.tree.leaves(nnx.state(got, nnx.Param)), jax.tree.leaves(nnx.state(want, nnx.Param))):
        np.testing.assert_array_equal(a, b)
    template = new_training_state(Target(), _net(), config)
    with pytest.warns(CheckpointFallbackWarning):
        state = checkpointing.restore_training_state(tmp_path, template)
    assert int(state.iteration) == 96 // 32
    _truncate(older)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError):  # nothing intact: the newest's error
            checkpointing.restore_network(tmp_path, _net(1))


def test_cli_eval_and_resume_skip_a_truncated_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = ["--network", "mlp", "--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "2",
            "--ppo.rollout-length", "16", "--ppo.n-epochs", "1", "--eval.n-envs", "4",
            "--eval.max-episode-length", "16", "--eval.every-steps", "512", "--checkpoint-every-steps", "128"]
    assert cli.main(["train", *tiny, "--ppo.total-steps", "512", "--run-dir", str(run), "--quiet"]) == 0
    checkpoints = checkpointing.list_checkpoints(run / "checkpoints")
    assert [s for s, _ in checkpoints] == [256, 384, 512]
    _truncate(checkpoints[-1][1])
    capsys.readouterr()
    with pytest.warns(CheckpointFallbackWarning) as caught:
        assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    warning = caught.pop(CheckpointFallbackWarning)
    line = format_warning(warning.message, warning.category, warning.filename, warning.lineno)
    assert line.startswith(f"nnx-ppo: warning: checkpoint step_000000000512 in {str(run / 'checkpoints')!r} "
                           "cannot be read (") and line.endswith("); loaded step_000000000384, the newest intact one\n")
    assert line.count("\n") == 1
    with pytest.warns(CheckpointFallbackWarning, match="loaded step_000000000384"):
        assert cli.main(["train", "--resume", str(run), "--ppo.total-steps", "640", "--quiet"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert [s for s, _ in checkpointing.list_checkpoints(run / "checkpoints")][-1] == 640
    # A checkpoint that does not match the network its config.json describes: one line, for eval and distill.
    config = json.loads((run / "config.json").read_text())
    config["network"]["kwargs"] = {"actor_hidden_sizes": [16, 16], "critic_hidden_sizes": [16, 16]}
    (run / "config.json").write_text(json.dumps(config))
    for argv in (["eval", str(run)], ["distill", str(run), "--run-dir", str(tmp_path / "student")]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "shape" in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "student").exists()
