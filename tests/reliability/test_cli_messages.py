"""What the command line says (issue 52): errors that name the real problem,
commands printed ready to paste, the checkpoint eval evaluated, one exit
code per kind of failure, and the learning rate a resume continues with.
One tiny training run (8 envs x 16 steps, 8 iterations) serves them all."""

import contextlib
import errno
import io
import json
import os
import pathlib
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo.algorithms import checkpointing

TINY = ["--network", "lstm", "--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "2",
        "--ppo.rollout-length", "16", "--ppo.n-epochs", "1", "--eval.n-envs", "8", "--eval.max-episode-length", "16",
        "--eval.every-steps", "512", "--checkpoint-every-steps", "512"]
TOTAL = 1024  # 8 iterations of 128 env steps, 2 updates each
LEARNING_RATE = 1e-3  # the cue_memory preset's


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(run, what train printed)``: a tiny run with learning-rate decay, in a directory with spaces in its name."""
    run = tmp_path_factory.mktemp("messages") / "a b" / "run 1"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["train", *TINY, "--ppo.learning-rate-decay", "--ppo.total-steps", str(TOTAL),
                         "--run-dir", str(run), "--quiet"])
    assert code == 0, out.getvalue()
    return run, out.getvalue()


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(rd.LOCK_FILE))
    return to


# ----------------------------------------------------------------------------- 1. sweep --grid


def test_a_misspelt_grid_field_is_named_unknown_with_the_right_one(tmp_path, capsys):
    """It said the field "cannot differ between the members (it changes array shapes)"."""
    run = tmp_path / "sweep"
    assert cli.main(["sweep", "--grid", "ppo.learnin-rate=1e-3,3e-3", "--run-dir", str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "unknown field ppo.learnin-rate (did you mean ppo.learning-rate?)" in line, line
    assert "array shapes" not in line
    assert not run.exists()
    # a real field that cannot be swept still says why
    assert cli.main(["sweep", "--grid", "ppo.n-envs=8,16", "--run-dir", str(run)]) == 2
    assert "ppo.n-envs cannot differ between the members" in _one_error_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- 2. commands to paste


def _pasted(line: str, after: str) -> list[str]:
    """The command a printed line offers after ``after``, split as a shell would."""
    return shlex.split(line.split(after, 1)[1])


def test_printed_commands_are_quoted_for_the_shell(trained, tmp_path, capsys):
    run, printed = trained
    shown = str(run)  # (an absolute path: not under the working directory)
    [evaluate] = [line for line in printed.splitlines() if line.startswith("evaluate with: ")]
    assert _pasted(evaluate, "evaluate with: ") == ["nnx-ppo", "eval", shown]
    [best] = [line for line in printed.splitlines() if line.startswith("best eval return ")]
    assert _pasted(best.removesuffix(")"), "kept: ") == ["nnx-ppo", "eval", shown, "--best"]

    assert cli.main(["resume", str(run), "--ppo.total-steps", str(TOTAL)]) == 0  # nothing to do
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert _pasted(line, "Train longer with: ") == ["nnx-ppo", "resume", shown, "--ppo.total-steps", "N"]

    started = tmp_path / "no checkpoint" / "run 2"  # a run that stopped before its first checkpoint
    started.mkdir(parents=True)
    shutil.copy(run / rd.CONFIG_FILE, started / rd.CONFIG_FILE)
    assert cli.main(["resume", str(started)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert _pasted(line, "start it again: ")[:5] == ["nnx-ppo", "train", "...", "--run-dir", str(started)]


def test_the_stop_line_is_quoted_for_the_shell(tmp_path, capsys):
    from types import SimpleNamespace

    from nnx_ppo._app.train import _summary

    run = tmp_path / "it's here"
    result = SimpleNamespace(total_steps=512, compile_seconds=1.0, eval_history=[], metrics={})
    _summary(result, 2.0, True, run)
    [line] = [line for line in capsys.readouterr().out.splitlines() if "continue with: " in line]
    assert _pasted(line, "continue with: ") == ["nnx-ppo", "resume", str(run)]


# ----------------------------------------------------------------------------- 3. --seed with --seeds


def test_seed_with_seeds_is_refused_in_one_line(tmp_path, capsys):
    """It trained seeds 0 and 1 and recorded seed 5."""
    run = tmp_path / "run"
    assert cli.main(["train", "--seed", "5", "--seeds", "0", "1", "--run-dir", str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--seed" in line and "--seeds" in line and "not both" in line, line
    assert not run.exists()
    assert cli.main(["sweep", "--seed=5", "--seeds", "0", "1", "--grid", "ppo.clip-range=0.1,0.2",
                     "--run-dir", str(run)]) == 2
    assert "not both" in _one_error_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- 4. Python: policy and configs


def test_a_policy_checks_the_batch_of_obs_and_done_against_its_carry():
    from flax import nnx

    from nnx_ppo.networks.factories import make_mlp_actor_critic, make_recurrent_actor_critic
    from nnx_ppo.policy import Policy

    policy = Policy(make_recurrent_actor_critic(5, 2, nnx.Rngs(0), hidden_size=4, encoder_sizes=(4,)))
    carry = policy.initial_carry(4)
    with pytest.raises(ValueError, match=r"obs has a batch of 3 envs \(shape \(3, 5\)\), but the carry holds 4 "
                                         r"\(shape \[\(4, 4\), .*initial_carry\(3\)") as caught:
        policy(carry, np.zeros((3, 5)))
    assert "\n" not in str(caught.value)
    for done in (np.zeros(3, bool), np.zeros((4, 1), bool)):
        expected = r"done must have shape \(4,\).*\(4, 5\).*got shape " + re.escape(str(done.shape))
        with pytest.raises(ValueError, match=expected):
            policy(carry, np.zeros((4, 5)), done)
    action, _ = policy(carry, np.zeros((4, 5)), np.zeros(4, bool))  # the right shapes act
    assert np.shape(action) == (4, 2)
    mlp = Policy(make_mlp_actor_critic(5, 2, (4,), (4,), nnx.Rngs(0)))  # a carry without a batch: done vs obs
    with pytest.raises(ValueError, match=r"done must have shape \(4,\)"):
        mlp(mlp.initial_carry(4), np.zeros((4, 5)), np.zeros(3, bool))


@pytest.mark.parametrize("make, message", [
    (lambda c: c.TrainConfig(ppo={"n_envs": 8}), "TrainConfig.ppo must be a PPOConfig, got dict {'n_envs': 8}"),
    (lambda c: c.TrainConfig(eval=None), "TrainConfig.eval must be an EvalConfig, got NoneType None"),
    (lambda c: c.TrainConfig(checkpoint_every_steps="100"),
     "TrainConfig.checkpoint_every_steps must be an integer or None, got str '100'"),
    (lambda c: c.TrainConfig(shard_seeds="no"), "TrainConfig.shard_seeds must be True or False, got str 'no'"),
    (lambda c: c.PPOConfig(gae_lambda="0.9"), "PPOConfig.gae_lambda must be a number, got str '0.9'"),
    (lambda c: c.PPOConfig(clip_range=[0.2]), "PPOConfig.clip_range must be a number, got list [0.2]"),
    (lambda c: c.PPOConfig(n_envs=True), "PPOConfig.n_envs must be an integer, got bool True"),
    (lambda c: c.PPOConfig(normalize_rewards=1), "PPOConfig.normalize_rewards must be True or False, got int 1"),
    (lambda c: c.PPOConfig(target_kl="0.01"), "PPOConfig.target_kl must be a number or None, got str '0.01'"),
    (lambda c: c.PPOConfig(learning_rate="3e-4"), "PPOConfig.learning_rate must be a positive finite number or a "
                                                  "schedule"),
    (lambda c: c.EvalConfig(n_envs=16.0), "EvalConfig.n_envs must be an integer, got float 16.0"),
])
def test_configs_check_the_types_of_their_fields(make, message):
    """``TrainConfig(ppo={"n_envs": 8})`` was accepted and failed later in the trainer as an AttributeError."""
    from nnx_ppo.algorithms import config

    with pytest.raises(TypeError) as caught:
        make(config)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)
    assert isinstance(caught.value, ValueError)  # (what code catching the configs' other checks catches)


def test_configs_take_ints_for_numbers_and_none_where_allowed():
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig

    ppo = PPOConfig(gae_lambda=1, clip_range=np.float32(0.1), reward_scale=2, gradient_clipping=None, target_kl=None,
                    normalize_rewards=np.bool_(True), learning_rate=1)
    config = TrainConfig(ppo=ppo, eval=EvalConfig(enabled=False), checkpoint_every_steps=None, n_devices=None)
    assert config.ppo.gae_lambda == 1 and config.ppo.learning_rate == 1


# ----------------------------------------------------------------------------- 5. --network-kwargs


@pytest.mark.parametrize("network, valid, absent", [
    ("lstm", ("hidden_size", "encoder_sizes", "forget_bias", "shared_trunk", "entropy_weight"), "update_bias"),
    ("gru", ("hidden_size", "encoder_sizes", "update_bias"), "forget_bias"),
    ("mlp", ("actor_hidden_sizes", "critic_hidden_sizes", "activation"), "hidden_size,"),
])
def test_a_wrong_network_kwarg_lists_the_keys_of_that_network(network, valid, absent, tmp_path, capsys):
    """The list left out the factory's own keys (hidden_size, encoder_sizes, forget_bias for an LSTM)."""
    argv = ["train", "--network", network, "--network-kwargs", '{"hiden_size": 3}', "--run-dir", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "unexpected keyword argument 'hiden_size'" in line, line
    for key in valid:
        assert key in line, (key, line)
    assert absent not in line.split("keyword arguments are ", 1)[1], line
    if network != "mlp":
        assert "(did you mean 'hidden_size'?)" in line


# ----------------------------------------------------------------------------- 6. eval: which checkpoint


def test_eval_names_the_step_it_evaluated_after_loading(trained, capsys):
    run, _ = trained
    assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith(f"with the final policy of {run}, saved at step {TOTAL:,}"), header
    assert cli.main(["eval", str(run), "--step", "7"]) == 2  # the header came before the error
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no checkpoint at step 7" in _one_error_line(captured.err)


def test_eval_says_when_it_fell_back_to_an_older_checkpoint(trained, tmp_path, capsys):
    from nnx_ppo.algorithms.checkpointing import CheckpointFallbackWarning

    run = _copy(trained[0], tmp_path / "copy")
    (_, older), (_, newest) = checkpointing.list_checkpoints(run / rd.CHECKPOINT_DIR)
    for path in (p for item in ("network", "training") for p in (newest / item).rglob("*") if p.is_file()):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a truncated write
    with pytest.warns(CheckpointFallbackWarning, match=f"loaded {older.name}"):
        assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith(f"saved at step {TOTAL // 2:,} (the newest checkpoint, step {TOTAL:,}, cannot be read: "
                           "fell back to the newest intact one)"), header


# ----------------------------------------------------------------------------- 7. one exit code per failure


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` read-only for this process, root included (whom permissions
    do not stop): the mode bits, what ``os.access`` answers, and creating
    directories and writing files in it."""
    inside = lambda path: folder == Path(path).absolute() or folder in Path(path).absolute().parents
    real_access, real_mkdir, real_write = os.access, pathlib.Path.mkdir, pathlib.Path.write_bytes

    def denied(path):
        return PermissionError(errno.EACCES, "Permission denied", str(path))

    def access(path, mode, *args, **kwargs):
        return False if inside(path) and mode & os.W_OK else real_access(path, mode, *args, **kwargs)

    def mkdir(self, *args, **kwargs):
        if inside(self) and not self.is_dir():
            raise denied(self)
        return real_mkdir(self, *args, **kwargs)

    def write_bytes(self, data):
        if inside(self):
            raise denied(self)
        return real_write(self, data)

    folder.chmod(0o555)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "access", access)
        patch.setattr(pathlib.Path, "mkdir", mkdir)
        patch.setattr(pathlib.Path, "write_bytes", write_bytes)
        try:
            yield
        finally:
            folder.chmod(0o755)


def test_a_read_only_target_is_the_same_exit_code_for_train_and_export(trained, tmp_path, capsys):
    """It was 1 for export and 2 for train (docs/cli.md, "Errors and exit codes": 2, a usage error)."""
    run, _ = trained
    target = tmp_path / "read-only"
    target.mkdir()
    with _read_only(target):
        train = cli.main(["train", "--run-dir", str(target / "run")])
        train_line = _one_error_line(capsys.readouterr().err)
        export = cli.main(["export", str(run), "--out", str(target / "policy")])
        export_line = _one_error_line(capsys.readouterr().err)
    assert train == export == 2, (train, export)
    assert "not writable" in train_line or "Permission denied" in train_line, train_line
    assert export_line.startswith(f"nnx-ppo: error: cannot export to {target / 'policy'}: ") and \
        "not writable" in export_line, export_line
    assert list(target.iterdir()) == []


# ----------------------------------------------------------------------------- 8. the learning rate on resume


def _rate(update: float, total_updates: int) -> float:
    return LEARNING_RATE * max(0.0, 1.0 - update / total_updates)


def test_the_learning_rate_is_logged_and_a_resume_says_how_its_decay_changes(trained, tmp_path, capsys):
    run = _copy(trained[0], tmp_path / "copy")
    rows = [r for r in rd.read_metrics(run) if not r.get("eval")]
    # each iteration's 2 updates, at counts 2k and 2k + 1 of 16: their mean rate
    expected = [_rate(2 * k + 0.5, 16) for k in range(len(rows))]
    np.testing.assert_allclose([r["train/learning_rate"] for r in rows], expected, rtol=1e-5)

    assert cli.main(["resume", str(run), "--ppo.total-steps", str(2 * TOTAL), "--quiet"]) == 0
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if "learning-rate decay" in line]
    assert line == (f"resuming changes the learning-rate decay: it now reaches 0 at {2 * TOTAL:,} env steps (32 "
                    f"updates; was {TOTAL:,}, 16), so at step {TOTAL:,} (update 16) the rate goes from 0 to 0.0005")
    rows = [r for r in rd.read_metrics(run) if not r.get("eval")]
    assert [r["env_steps"] for r in rows][-9:-7] == [TOTAL, TOTAL + 128]
    resumed = [r["train/learning_rate"] for r in rows[8:]]
    np.testing.assert_allclose(resumed, [_rate(16 + 2 * k + 0.5, 32) for k in range(8)], rtol=1e-5)
    config = json.loads((run / rd.CONFIG_FILE).read_text())
    assert config["resumed"][-1]["changes"] == {"ppo.total_steps": [TOTAL, 2 * TOTAL]}
