"""A run directory through its life: a failed start is refused, then run again with --overwrite, a
finished run resumed without more steps changes nothing, eval and
--record-activations check their flags before any work, W&B without a key
logs offline, and a resumed run evaluates where an uninterrupted one does."""

import dataclasses
import json

import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.trainer import train_ppo

TINY = ["--network", "mlp", "--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "2",
        "--ppo.rollout-length", "16", "--ppo.total-steps", "256", "--eval.n-envs", "4",
        "--eval.max-episode-length", "8", "--eval.every-steps", "128", "--quiet"]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    """A run directory left by a start that failed (config.json and a
    metrics row, no checkpoint): refused without --overwrite (nothing
    touched), trained into again with it."""
    run = tmp_path_factory.mktemp("restart") / "run"
    run.mkdir()
    (run / "config.json").write_text('{"env": "cue_memory", "network": {}}')
    (run / "metrics.jsonl").write_text('{"env_steps": 999, "train/episode_return": 5.0}\n')
    refused = cli.main(["train", *TINY, "--run-dir", str(run)])
    untouched = (run / "metrics.jsonl").read_text() == '{"env_steps": 999, "train/episode_return": 5.0}\n'
    return run, (refused, untouched, cli.main(["train", *TINY, "--run-dir", str(run), "--overwrite"]))


def test_a_failed_start_can_be_run_again(restarted, capsys):
    run, (refused, untouched, code) = restarted
    assert refused == 2 and untouched
    assert code == 0
    assert [r["env_steps"] for r in rd.read_metrics(run) if not r.get("eval")] == [128, 256]


def test_resuming_a_finished_run_changes_nothing(restarted, capsys):
    run, _ = restarted
    before = (run / "config.json").read_text(), (run / "metrics.jsonl").read_text()
    assert cli.main(["train", "--resume", str(run)]) == 0
    assert "already trained 256 env steps" in capsys.readouterr().out
    assert ((run / "config.json").read_text(), (run / "metrics.jsonl").read_text()) == before


def test_eval_flags_are_checked_before_any_work(restarted, tmp_path, capsys):
    run, _ = restarted
    assert cli.main(["eval", str(run), "--max-episode-length", "-5"]) == 2
    assert "--max-episode-length must be positive" in capsys.readouterr().err
    out = tmp_path / "missing" / "acts.npz"
    assert cli.main(["eval", str(run), "--record-activations", "layers/0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1


def test_wandb_without_a_key_logs_offline_with_a_warning(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    assert cli.main(["train", *TINY, "--ppo.total-steps", "128", "--wandb", "--run-dir", str(run)]) == 0
    assert "no W&B API key" in capsys.readouterr().err
    run_id = json.loads((run / "config.json").read_text())["wandb_id"]
    assert list((run / "wandb").glob(f"offline-run-*-{run_id}"))


def test_a_resumed_run_evaluates_where_an_uninterrupted_run_does(tmp_path):
    """Evaluations every 256 env steps, 128 per iteration: after the first
    iteration, then at 384 and at the end. A run stopped at 256 and resumed
    evaluates at 384 and 512 (not again right after resuming)."""
    from nnx_ppo.envs import make
    from nnx_ppo.network_spec import NetworkSpec

    env = make("cue_memory", n_cues=2, delay=2)
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=16, n_minibatches=2, total_steps=512),
                         eval=EvalConfig(every_steps=256, n_envs=4, max_episode_length=6), checkpoint_every_steps=256)
    network = NetworkSpec.sized("cue_memory", "mlp", 8, env_kwargs={"n_cues": 2, "delay": 2})
    whole = train_ppo(env, network, config)
    assert [s for s, _ in whole.eval_history] == [128, 384, 512]
    half = dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, total_steps=256))
    train_ppo(env, network, half, checkpoint_dir=str(tmp_path))
    resumed = train_ppo(env, network, config, checkpoint_dir=str(tmp_path), resume_from=str(tmp_path))
    assert [s for s, _ in resumed.eval_history] == [384, 512]
    assert resumed.eval_history[-1][1] == pytest.approx(whole.eval_history[-1][1])


@pytest.mark.slow  # W&B waits 30 s for its server; `make test ARGS="-m slow"`
def test_wandb_that_cannot_be_reached_logs_offline_with_a_warning(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    assert cli.main(["train", *TINY, "--ppo.total-steps", "128", "--wandb", "--run-dir", str(run)]) == 0
    err = capsys.readouterr().err
    assert "W&B could not be reached" in err and "Traceback" not in err, err
    run_id = json.loads((run / "config.json").read_text())["wandb_id"]
    assert list((run / "wandb").glob(f"offline-run-*-{run_id}"))
