"""Bad input is one line on stderr and leaves no run directory behind."""

import pytest

from nnx_ppo import cli
from nnx_ppo.algorithms.config import TrainConfig


@pytest.mark.parametrize("flags", [["--seed", str(2**70)], ["--seeds", "0", str(2**70)], ["--seed", str(-2**64)]])
def test_a_seed_out_of_range_is_refused_before_anything_is_written(flags, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", *flags, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "2**63" in err and len(err.strip().splitlines()) == 1, err
    assert not run.exists()


def test_train_config_checks_its_seed():
    assert TrainConfig(seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(ValueError, match="TrainConfig.seed must be between"):
        TrainConfig(seed=2**63)
    with pytest.raises(ValueError, match="TrainConfig.seed must be an integer"):
        TrainConfig(seed=1.5)


@pytest.mark.parametrize("content", ["{broken", "[1, 2]", '{"env": "cue_memory"}'])
def test_a_broken_config_json_is_one_line(content, tmp_path, capsys):
    (tmp_path / "config.json").write_text(content)
    for argv in (["eval", str(tmp_path)], ["export", str(tmp_path), "--out", str(tmp_path / "x")],
                 ["distill", str(tmp_path)], ["train", "--resume", str(tmp_path)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "config.json" in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_a_busy_coordinator_port_is_one_line(tmp_path, capsys):
    """Process 0 of a multi-process run whose coordinator port is taken: one
    line and exit 2, before JAX starts its distributed client (which crashed
    with SIGSEGV)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = cli.main(["train", "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
                         "--process-id", "0", "--run-dir", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is not free" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field, value", [("clip_range", float("nan")), ("learning_rate", float("inf")),
                                          ("critic_loss_weight", float("inf")), ("weight_decay", float("inf")),
                                          ("gradient_clipping", float("inf")), ("discounting_factor", float("nan"))])
def test_a_non_finite_hyperparameter_is_refused_by_name(field, value):
    from nnx_ppo.algorithms.config import PPOConfig

    with pytest.raises(ValueError, match=f"PPOConfig.{field} must be a (positive )?finite number"):
        PPOConfig(**{field: value})


def test_a_run_directory_that_cannot_be_written_is_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    for run, why in ((tmp_path / "a_file" / "run", "Not a directory"), (tmp_path / "run", "is a file in the way")):
        if why == "is a file in the way":
            run.mkdir()
            (run / "tb").write_text("not TensorBoard's folder")
        assert cli.main(["train", "--run-dir", str(run)]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["tb"]  # nothing written


def test_an_unwritable_run_directory_is_one_line(tmp_path, capsys, monkeypatch):
    """(This machine runs the tests as root, who may write anywhere: the
    permission is taken away by monkeypatching os.access.)"""
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert cli.main(["train", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "is not writable" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_action_spaces_are_checked_before_the_env_steps():
    """A 3-way categorical head on CartPole's Discrete(2), and a continuous
    head on it: each a ValueError naming the mismatch, before any rollout."""
    from flax import nnx

    from nnx_ppo.algorithms.config import PPOConfig
    from nnx_ppo.algorithms.ppo import new_training_state
    from nnx_ppo.envs import make
    from nnx_ppo.networks.adapter import PPOAdapter
    from nnx_ppo.networks.containers import Sequential
    from nnx_ppo.networks.feedforward import Dense
    from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler

    env = make("gymnax:CartPole-v1")
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, n_minibatches=1))
    rngs = nnx.Rngs(0)
    three = Sequential([Dense(4, 8, rngs), PPOAdapter(action=Sequential([Dense(8, 3, rngs), CategoricalSampler(rngs)]),
                                                      value=Dense(8, 1, rngs))])
    with pytest.raises(ValueError, match=r"chooses among 3 actions, but the env's action space is Discrete\(2\)"):
        new_training_state(env, three, config)
    continuous = Sequential([Dense(4, 8, rngs), PPOAdapter(
        action=Sequential([Dense(8, 2, rngs), NormalTanhSampler(rngs)]), value=Dense(8, 1, rngs))])
    with pytest.raises(ValueError, match="expected integer actions .* use a CategoricalSampler head"):
        new_training_state(env, continuous, config)


def test_a_learning_curve_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch):
    """Disk full while drawing the curve: a warning, once; the rows are
    written and no temporary PNG stays."""
    from nnx_ppo import runner as rd

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", full)
    logger = rd.RunLogger(tmp_path, steps_per_iteration=8, tensorboard=False)
    with pytest.warns(rd.RunOutputWarning, match="No space left on device"):
        logger({"eval/episode_return": 1.0}, 8)
    logger({"eval/episode_return": 2.0}, 16)  # (warned once)
    logger.close()
    assert [r["eval/episode_return"] for r in rd.read_metrics(tmp_path)] == [1.0, 2.0]
    assert not list(tmp_path.glob("*.tmp*")) and not (tmp_path / rd.CURVE_FILE).exists()


def test_a_stopped_distillation_suggests_what_works(tmp_path, capsys):
    """A distillation run resumes like any other run: the stop line says how."""
    from types import SimpleNamespace

    from nnx_ppo._app.train import _summary

    result = SimpleNamespace(total_steps=512, compile_seconds=1.0, eval_history=[], metrics={})
    _summary(result, 2.0, True, tmp_path / "student")
    out = capsys.readouterr().out
    assert "continue with: nnx-ppo resume" in out and "nnx-ppo eval" in out


def test_a_checkpoint_directory_replaced_during_the_run_is_one_error(tmp_path):
    """Probed through the CLI (checkpoints/ replaced by a file while training):
    exit 1 with this one line; here the hook alone."""
    from nnx_ppo.algorithms.trainer import checkpoint_hook

    replaced = tmp_path / "checkpoints"
    replaced.write_text("not a directory")
    with pytest.raises(RuntimeError, match="checkpoints is no longer a directory"):
        checkpoint_hook(TrainConfig(), str(replaced), None)(None, 8)
