"""The ``nnx-ppo`` command line: train / resume / eval / envs, run directory
contents, clean errors and Ctrl-C. Budgets are tiny (8 envs, ~1k steps)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo._app import runs as app_runs

REPO = Path(__file__).resolve().parents[1]

N_ENVS, T = 8, 16
TINY = [
    "--network", "lstm", "--hidden-size", "8",
    "--ppo.n-envs", str(N_ENVS), "--ppo.n-minibatches", "2", "--ppo.rollout-length", str(T),
    "--ppo.n-epochs", "1", "--eval.n-envs", "8", "--eval.max-episode-length", "16",
]
TOTAL = 1024  # 8 iterations of 8 x 16 steps
ITERATIONS = TOTAL // (N_ENVS * T)


def iteration_rows(run: Path) -> list[dict]:
    return [r for r in rd.read_metrics(run) if not r.get("eval")]


def eval_rows(run: Path) -> list[dict]:
    return [r for r in rd.read_metrics(run) if r.get("eval")]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    code = cli.main(["train", *TINY, "--ppo.total-steps", str(TOTAL), "--eval.every-steps", "512",
                     "--run-dir", str(run), "--quiet"])
    assert code == 0
    return run


def test_train_writes_run_directory(trained_run: Path):
    config = json.loads((trained_run / "config.json").read_text())
    assert config["env"] == "cue_memory"
    assert config["env_kwargs"] == cli.DEFAULT_ENV_KWARGS
    assert config["network"]["kind"] == "lstm"
    assert config["network"]["hidden_size"] == 8
    assert config["network"]["kwargs"] == {"hidden_size": 8, "encoder_sizes": [8]}
    assert config["config"]["ppo"]["n_envs"] == N_ENVS
    assert config["config"]["ppo"]["total_steps"] == TOTAL
    assert rd.train_config_from_dict(config["config"]).ppo.rollout_length == T

    rows = iteration_rows(trained_run)
    assert len(rows) == ITERATIONS
    assert [r["iteration"] for r in rows] == list(range(1, ITERATIONS + 1))
    assert [r["env_steps"] for r in rows] == [i * N_ENVS * T for i in range(1, ITERATIONS + 1)]
    assert "loss/total" in rows[0] and "train/episode_return" in rows[0]
    evals = eval_rows(trained_run)
    assert evals and evals[-1]["env_steps"] == TOTAL
    assert 0.0 <= evals[-1]["eval/episode_return"] <= 1.0

    png = trained_run / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((trained_run / "tb").glob("events.out.tfevents.*"))
    assert (trained_run / "checkpoints").is_dir() and any((trained_run / "checkpoints").iterdir())


def test_eval_prints_return_statistics(trained_run: Path, capsys):
    assert cli.main(["eval", str(trained_run), "--episodes", "8"]) == 0
    out = capsys.readouterr().out
    assert "8 deterministic episodes" in out
    for word in ("mean", "std", "min", "max"):
        assert word in out


def test_eval_picks_the_best_or_a_step(trained_run: Path, capsys):
    assert len(list((trained_run / rd.CHECKPOINT_DIR / "best").glob("step_*"))) == 1
    assert cli.main(["eval", str(trained_run), "--best", "--episodes", "4"]) == 0
    assert "with the best evaluated policy of" in capsys.readouterr().out
    assert cli.main(["eval", str(trained_run), "--step", str(TOTAL), "--episodes", "4"]) == 0
    assert f"with the policy at step {TOTAL} of" in capsys.readouterr().out
    assert cli.main(["eval", str(trained_run), "--step", "7"]) == 2
    assert "no checkpoint at step 7" in capsys.readouterr().err
    assert cli.main(["eval", str(trained_run), "--best", "--step", str(TOTAL)]) == 2


def test_export_writes_a_policy_that_acts_as_load_policy(trained_run: Path, tmp_path, capsys):
    """`nnx-ppo export` of the best policy: the artifact's actions over an
    episode with resets are load_policy's (step="best")."""
    import jax
    import numpy as np

    from nnx_ppo.network_spec import load_network
    from nnx_ppo.policy import Policy, load_exported, load_policy

    out = tmp_path / "policy"
    assert cli.main(["export", str(trained_run), "--best", "--batch-size", "4", "--out", str(out)]) == 0
    assert "exported the best evaluated policy" in capsys.readouterr().out
    exported, policy = load_exported(out), load_policy(trained_run, step="best")
    obs = jax.random.normal(jax.random.key(0), (20, 4, 5))  # cue_memory: 4 cues + a "now" flag
    done = np.zeros((20, 4), bool)
    done[7, 1] = done[12, :] = True
    carry, exported_carry = policy.initial_carry(4), exported.initial_carry()
    for t in range(20):
        action, carry = policy(carry, obs[t], done[t])
        exported_action, exported_carry = exported.step(exported_carry, obs[t], done[t])
        np.testing.assert_array_equal(np.asarray(exported_action), np.asarray(action))
    assert cli.main(["export", str(trained_run), "--seed", "3", "--out", str(out)]) == 2
    assert "this run trained one seed" in capsys.readouterr().err
    # load_policy (latest) acts as the network load_network restores
    latest, restored = load_policy(trained_run), Policy(load_network(trained_run))
    carry, restored_carry = latest.initial_carry(4), restored.initial_carry(4)
    for t in range(20):
        action, carry = latest(carry, obs[t], done[t])
        restored_action, restored_carry = restored(restored_carry, obs[t], done[t])
        np.testing.assert_array_equal(np.asarray(action), np.asarray(restored_action))
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing")


def test_eval_video_on_unrenderable_env_is_a_clear_error(trained_run: Path, capsys):
    assert cli.main(["eval", str(trained_run), "--video", str(trained_run / "v.gif")]) == 2
    err = capsys.readouterr().err
    assert "cannot render" in err and "Traceback" not in err


def test_train_refuses_to_overwrite_a_run(trained_run: Path, capsys):
    assert cli.main(["train", "--run-dir", str(trained_run)]) == 2
    assert f"nnx-ppo resume {trained_run}" in capsys.readouterr().err


def test_distill_a_run_into_a_gru_then_eval_it(trained_run: Path, tmp_path, capsys):
    student = tmp_path / "student"
    assert cli.main(["distill", str(trained_run), "--network", "gru", "--hidden-size", "8", "--total-steps", "512",
                     "--teacher-mixing", "0.5", "--run-dir", str(student), "--quiet"]) == 0
    config = json.loads((student / "config.json").read_text())
    assert config["env"] == "cue_memory" and config["network"]["kind"] == "gru"
    assert config["distillation"]["teacher_run"] == str(trained_run.resolve())
    assert config["distillation"]["teacher_mixing"] == 0.5
    rows = iteration_rows(student)
    assert rows[-1]["env_steps"] == 512 and "loss/distillation" in rows[-1] and "distill/teacher_mixing" in rows[-1]
    assert rows[-1]["replay/max_error"] < 1e-5
    assert cli.main(["eval", str(student), "--episodes", "8"]) == 0
    assert "8 deterministic episodes" in capsys.readouterr().out
    assert cli.main(["resume", str(student), "--ppo.total-steps", "768", "--quiet"]) == 0  # from its teacher
    assert iteration_rows(student)[-1]["env_steps"] == 768
    assert rd.read_run_config(student)["distillation"] == config["distillation"]
    assert cli.main(["distill", str(tmp_path / "nothing")]) == 2


def test_envs_lists_cue_memory(capsys):
    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out.split()
    assert "cue_memory" in out and "gymnax:CartPole-v1" in out


def test_envs_lists_the_presets(capsys):
    from nnx_ppo.presets import PRESETS

    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "tuned presets" in out
    for preset in PRESETS:
        assert any(preset.env in line and f" {preset.network} " in line for line in out.splitlines())


def test_train_env_starts_from_its_preset_and_flags_override_it():
    from nnx_ppo.presets import get_preset, library_defaults

    cmd, _ = cli._parse(["train", "gymnax:Pendulum-v1"])
    preset = get_preset("gymnax:Pendulum-v1")
    assert (cmd.setup.network, cmd.setup.hidden_size, cmd.config) == (preset.network, preset.hidden_size, preset.config)
    assert cmd.config.ppo.reward_scale == 0.1  # the preset's reward scale is its config's

    cmd, _ = cli._parse(["train", "gymnax:Pendulum-v1", "--ppo.learning-rate", "5e-4"])
    assert cmd.config.ppo.learning_rate == 5e-4
    assert cmd.config.ppo.discounting_factor == preset.config.ppo.discounting_factor
    assert cmd.config.ppo.reward_scale == preset.config.ppo.reward_scale

    cmd, _ = cli._parse(["train", "gymnax:Pendulum-v1", "--compiler-options", "xla_tpu_scoped_vmem_limit_kib", "8192"])
    assert cmd.config.compiler_options == {"xla_tpu_scoped_vmem_limit_kib": "8192"}

    cmd, _ = cli._parse(["train", "gymnax:Pendulum-v1", "--network", "lstm"])
    assert cmd.config == get_preset("gymnax:Pendulum-v1", "lstm").config and cmd.setup.network == "lstm"

    cmd, _ = cli._parse(["train", "gymnax:Pendulum-v1", "--no-preset"])  # the library defaults (of an LSTM)
    defaults = library_defaults("gymnax:Pendulum-v1", cmd.setup.network, cmd.setup.hidden_size) or cli.TrainCommand()
    assert cmd.config == defaults.config and cmd.config.ppo.reward_scale == 1.0

    cmd, _ = cli._parse(["train", "playground:CartpoleBalance"])  # train-only env kwargs come along
    assert json.loads(cmd.setup.train_env_kwargs) == get_preset("playground:CartpoleBalance").train_env_kwargs
    assert cmd.setup.env_kwargs is None

    cmd, _ = cli._parse(["train", "cue_memory_long"])  # so do the network's own settings
    assert json.loads(cmd.setup.network_kwargs) == get_preset("cue_memory_long").network_kwargs == {"forget_bias": 3.0}

    cmd, _ = cli._parse(["train", "gymnax:Acrobot-v1", "--network", "gru"])  # no preset: the defaults
    defaults = library_defaults("gymnax:Acrobot-v1", "gru", cmd.setup.hidden_size) or cli.TrainCommand()
    assert cmd.config == defaults.config


def test_bad_reward_scale_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["train", "--ppo.reward-scale", "0", "--run-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == "nnx-ppo: error: PPOConfig.reward_scale must be positive, got 0.0\n"


def test_unknown_env_is_a_one_line_error(tmp_path, capsys):
    assert cli.main(["train", "no_such_env", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nnx-ppo: error: Unknown environment 'no_such_env'")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_bad_env_kwargs_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["train", "--env-kwargs", "not json", "--run-dir", str(tmp_path / "r")]) == 2
    assert "--env-kwargs must be a JSON object" in capsys.readouterr().err


def test_resume_of_missing_run_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "not an nnx-ppo run directory" in capsys.readouterr().err


def _console(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "nnx-ppo"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "nnx_ppo.cli", *args]


def test_console_entry_point_unknown_env_exit_code():
    proc = subprocess.run(_console("train", "no_such_env"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Unknown environment 'no_such_env'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_compiled_programs_are_kept_between_runs(tmp_path):
    """A second run of the same program (another seed) loads every compiled
    program from the cache the first run filled (~/.cache/nnx_ppo/jax, here
    under XDG_CACHE_HOME)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    folder = tmp_path / "cache" / "nnx_ppo" / "jax"
    entries = []
    for seed in (0, 1):
        proc = subprocess.run(_console("train", *TINY, "--network", "mlp",  # (compiles faster than an LSTM)
                                       "--ppo.total-steps", "1024", "--seed", str(seed),
                                       "--run-dir", str(tmp_path / f"run{seed}"), "--quiet"),
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr
        entries.append(sorted(p.name for p in folder.iterdir()))
    assert entries[0] and entries[1] == entries[0]


def test_compilation_cache_can_be_turned_off(tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # what JAX_ENABLE_COMPILATION_CACHE=false sets
    try:
        app_runs.compilation_cache()
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
    assert not (tmp_path / "nnx_ppo").exists()


def test_ctrl_c_stops_cleanly_then_resume_appends(tmp_path):
    """Real process: SIGINT after the first iterations -> a final checkpoint
    and exit 0; then ``--resume`` (in-process) continues and appends rows."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Without learning-rate decay the resume's longer budget leaves the program as it was:
    # the resume loads it from the compilation cache the process filled.
    proc = subprocess.Popen(
        _console("train", *TINY, "--ppo.no-learning-rate-decay", "--ppo.total-steps", "100000000",
                 "--eval.every-steps", "100000000", "--run-dir", str(run), "--quiet"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    lines = []
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("compiled in"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert proc.returncode == 0, out
    assert "stopped early" in out and "nnx-ppo resume" in out
    assert out.strip().splitlines()[-1].startswith("run directory:")

    stopped_rows = iteration_rows(run)
    assert stopped_rows
    stopped_steps = stopped_rows[-1]["env_steps"]
    ckpts = sorted((run / "checkpoints").iterdir())
    assert ckpts and ckpts[-1].name.endswith(str(stopped_steps))

    target = stopped_steps + 2 * N_ENVS * T
    assert cli.main(["train", "--resume", str(run), "--ppo.total-steps", str(target), "--quiet"]) == 0
    rows = iteration_rows(run)
    assert len(rows) == len(stopped_rows) + 2
    assert rows[: len(stopped_rows)] == stopped_rows
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    config = json.loads((run / "config.json").read_text())  # as written at the start, and the resume
    assert config["config"]["ppo"]["total_steps"] == 100_000_000
    assert [e["changes"] for e in config["resumed"]] == [{"ppo.total_steps": [100_000_000, target]}]
    assert rd.read_run_config(run)["config"]["ppo"]["total_steps"] == target  # what the run trains with now
    assert eval_rows(run)[-1]["env_steps"] == target


def test_wandb_flag_without_wandb_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert cli.main(["train", "--wandb", "--run-dir", str(tmp_path / "r")]) == 2
    assert "pip install wandb" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_wandb_logs_offline_with_the_installed_release(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "r"
    # (trained_run's training program: loaded from the compilation cache)
    assert cli.main(["train", *TINY, "--ppo.total-steps", str(TOTAL), "--eval.every-steps", "512", "--wandb",
                     "--run-dir", str(run), "--quiet"]) == 0
    run_id = json.loads((run / "config.json").read_text())["wandb_id"]
    offline = list((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert offline, (wandb.__version__, list((run / "wandb").iterdir()))
    assert list(offline[0].glob("*.wandb"))


@pytest.mark.slow  # 1.5 minutes of MJX compilation on 2 cores; `make test ARGS="-m slow"`
def test_playground_train_then_eval_video(tmp_path):
    """A Playground env trains through the CLI (checkpoints hold MJX states
    with empty buffers) with an MP4 video of its evaluation episode in the run
    directory and TensorBoard, and `eval --video` writes a GIF of the policy."""
    pytest.importorskip("mujoco_playground")
    run = tmp_path / "pg"
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    train = subprocess.run(
        _console("train", "playground:CartpoleBalance", "--network", "mlp", "--ppo.total-steps", "256",
                 "--ppo.n-envs", "8", "--ppo.n-minibatches", "2", "--ppo.rollout-length", "16",
                 "--eval.every-steps", "256", "--eval.n-envs", "2", "--eval.max-episode-length", "20",
                 "--video-every", "1", "--quiet", "--run-dir", str(run)),
        capture_output=True, text=True, timeout=600, env=env)
    if train.returncode != 0 and "render" in (train.stdout + train.stderr).lower():
        pytest.skip(f"no OpenGL context for MuJoCo rendering here: {train.stderr[-300:]}")
    assert train.returncode == 0, train.stdout + train.stderr
    videos = sorted((run / "videos").glob("step_*.mp4"))  # one per evaluation: 256 steps and the end
    assert videos and videos[0].stat().st_size > 0
    assert any(b"eval/video" in f.read_bytes() for f in (run / "tb").glob("events.out.tfevents.*"))
    video = tmp_path / "policy.gif"
    evaluation = subprocess.run(
        _console("eval", str(run), "--episodes", "1", "--max-episode-length", "20", "--video", str(video)),
        capture_output=True, text=True, timeout=600, env=env)
    if evaluation.returncode != 0 and "render" in (evaluation.stdout + evaluation.stderr).lower():
        pytest.skip(f"no OpenGL context for MuJoCo rendering here: {evaluation.stderr[-300:]}")
    assert evaluation.returncode == 0, evaluation.stdout + evaluation.stderr
    assert video.read_bytes()[:6] in (b"GIF87a", b"GIF89a")


def test_video_writer_is_checked_before_rendering(tmp_path):
    from nnx_ppo._app.commands import CliError
    from nnx_ppo._app.trained import check_video_writer, write_video

    check_video_writer(str(tmp_path / "v.mp4"))  # imageio-ffmpeg comes with the playground extra
    check_video_writer(str(tmp_path / "v.gif"))
    with pytest.raises(CliError, match="cannot write"):
        write_video(str(tmp_path / "v.xyz"), [], fps=10.0)


def test_video_every_on_an_unrenderable_env_is_an_error_before_training(tmp_path, capsys):
    assert cli.main(["train", *TINY, "--video-every", "1", "--run-dir", str(tmp_path / "r")]) == 2
    assert "cannot render" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


OWN_NETWORK = """
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


class Leaky(StatefulModule):
    \"\"\"A leaky integrator: h = decay * h + x.\"\"\"

    def __init__(self, size, decay):
        self.size, self.decay = size, decay

    def __call__(self, state, x, rollout_extras=None):
        h = self.decay * state + x
        return StatefulModuleOutput(next_state=h, output=h)

    def initialize_state(self, batch_size):
        return jnp.zeros((batch_size, self.size))


def make_net(env, rngs, decay=0.9):
    obs, n = env.observation_space.shape[0], env.action_space.n
    return Sequential([Dense(obs, 8, rngs, activation=jnp.tanh), Leaky(8, decay),
                       PPOAdapter(action=Sequential([Dense(8, n, rngs), CategoricalSampler(rngs)]),
                                  value=Dense(8, 1, rngs))])
"""


def test_train_several_seeds_in_one_run(tmp_path, capsys, monkeypatch):
    """--seeds with the user's own network (--network FILE.py:FUNCTION, a
    custom stateful module): one program, one run directory; rows carry their
    seed; the curve is drawn; the summary lists each seed's final return;
    eval (from another directory), distill and --resume rebuild the network
    from config.json."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "own_net.py").write_text(OWN_NETWORK)
    monkeypatch.chdir(tmp_path / "src")
    run = tmp_path / "seeds"
    code = cli.main(["train", *TINY, "--network", "own_net.py:make_net", "--network-kwargs", '{"decay": 0.8}',
                     "--ppo.total-steps", "512",
                     "--eval.every-steps", "256", "--seeds", "0", "1", "--iterations-per-call", "2",
                     "--run-dir", str(run), "--quiet"])
    assert code == 0
    config = json.loads((run / "config.json").read_text())
    assert config["seeds"] == [0, 1]
    assert config["network"]["kind"] == f"{tmp_path / 'src' / 'own_net.py'}:make_net"
    assert config["network"]["kwargs"] == {"decay": 0.8}  # --network-kwargs reach a network function too
    rows = rd.read_metrics(run)
    for seed in (0, 1):
        assert len([r for r in rows if r.get("seed") == seed and not r.get("eval")]) == 4
        assert len([r for r in rows if r.get("seed") == seed and r.get("eval")]) == 2
    assert (run / rd.CURVE_FILE).stat().st_size > 0
    out = capsys.readouterr().out
    assert "training own_net.py:make_net on cue_memory" in out
    assert "final eval return per seed: 0: " in out
    assert "best eval return seed 0: " in out and ", seed 1: " in out and "--best" in out
    assert cli.main(["train", "--seeds", "1", "1", "--run-dir", str(tmp_path / "dup")]) == 2
    capsys.readouterr()
    for bad, says in (("missing.py:make_net", "no file"), ("own_net.py:nothing", "has no function 'nothing'"),
                      ("no_such_pkg.mod:f", "cannot import no_such_pkg.mod"), ("transformer", "MODULE:FUNCTION")):
        assert cli.main(["train", *TINY, "--network", bad, "--run-dir", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    assert cli.main(["train", *TINY, "--network", "own_net.py:make_net", "--network-kwargs", '{"decy": 0.5}',
                     "--run-dir", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "cannot build the network" in err and "'decy'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "bad").exists()
    monkeypatch.chdir(tmp_path)  # the run names the file by its absolute path
    # One checkpoint holds both seeds: eval reports each, --resume continues both.
    assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "seed 0: return" in out and "seed 1: return" in out
    assert cli.main(["eval", str(run), "--best", "--episodes", "4"]) == 0  # one best policy per seed
    out = capsys.readouterr().out
    assert "best evaluated policy" in out and "seed 0: return" in out and "seed 1: return" in out
    assert cli.main(["eval", str(run), "--list-modules"]) == 0
    assert "Leaky" in capsys.readouterr().out
    assert cli.main(["distill", str(run), "--network", "src/own_net.py:make_net",  # teacher: seed 0's policy
                     "--total-steps", "256", "--run-dir", str(tmp_path / "student"), "--quiet"]) == 0
    assert json.loads((tmp_path / "student" / "config.json").read_text())["network"]["kind"] == \
        config["network"]["kind"]
    assert cli.main(["train", "--resume", str(run), "--ppo.total-steps", "768", "--quiet"]) == 0
    rows = rd.read_metrics(run)
    for seed in (0, 1):
        assert [r["iteration"] for r in rows if r.get("seed") == seed and not r.get("eval")] == [1, 2, 3, 4, 5, 6]


class _PoisonedDrift:
    """Never-ending env (obs a random 3-vector, reward ``-|a - obs[:2]|``)
    whose envs with a reset score below ``threshold`` emit NaN rewards from
    their 20th step on: which seeds fail is fixed by their initial resets."""

    threshold = -1.0

    @property
    def observation_space(self):
        from nnx_ppo.envs import Box

        return Box((3,), -1.0, 1.0)

    @property
    def action_space(self):
        from nnx_ppo.envs import Box

        return Box((2,), -1.0, 1.0)

    def reset(self, key):
        import jax
        import jax.numpy as jnp

        from nnx_ppo.envs import EnvState

        zero = jnp.zeros((), jnp.float32)
        return EnvState(obs=jax.random.uniform(key, (3,), minval=-1.0, maxval=1.0), reward=zero, done=zero,
                        metrics={}, info={"truncated": zero, "steps": jnp.zeros((), jnp.int32),
                                          "score": jax.random.uniform(jax.random.fold_in(key, 1))}, data=key)

    def step(self, state, action):
        import jax
        import jax.numpy as jnp

        key, sub = jax.random.split(state.data)
        steps = state.info["steps"] + 1
        reward = -jnp.sum(jnp.abs(action - state.obs[:2]))
        reward = jnp.where((state.info["score"] < self.threshold) & (steps >= 20), jnp.nan, reward)
        return dataclasses.replace(state, obs=jax.random.uniform(sub, (3,), minval=-1.0, maxval=1.0), reward=reward,
                                   info={**state.info, "steps": steps}, data=key)


def test_a_failing_seed_is_named_and_the_run_stays_resumable(tmp_path, capsys, monkeypatch):
    """--seeds with one seed whose rewards turn NaN in its 2nd iteration: the
    other seed trains to the end, the failed one is named, the exit code is
    1, and --resume continues the run: the failed seed stays failed (it is
    not trained again, and its failure is recorded once)."""
    import jax.numpy as jnp
    from flax import nnx

    from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import new_training_state
    from nnx_ppo.envs import registry
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = _PoisonedDrift()
    monkeypatch.setitem(registry._BUILTINS, "poisoned_drift", (lambda: env, None))
    net = make_actor_critic_for_env(env, "mlp", nnx.Rngs(0))
    lowest = {s: float(jnp.min(new_training_state(env, net, TrainConfig(
        ppo=PPOConfig(n_envs=N_ENVS), seed=s)).rollout.env_state.info["score"])) for s in (0, 1)}
    bad, good = sorted(lowest, key=lowest.get)
    env.threshold = (lowest[bad] + lowest[good]) / 2
    run = tmp_path / "seeds"
    flags = [*TINY, "--ppo.total-steps", "512", "--eval.every-steps", "256", "--seeds", "0", "1", "--quiet"]
    assert cli.main(["train", "poisoned_drift", *flags, "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"seed {bad} failed at iteration 2 (256 env steps)" in err and "NaN" in err
    assert f"seeds [{bad}] failed" in err and "nnx-ppo resume" in err
    rows = [r for r in iteration_rows(run) if rd.FAILURE_KEY not in r]
    assert [r["iteration"] for r in rows if r.get("seed") == good] == [1, 2, 3, 4]
    assert [r["iteration"] for r in rows if r.get("seed") == bad] == [1]
    assert rd.failure_rows(rd.read_metrics(run))[bad]["iteration"] == 2  # the run directory keeps the failure
    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0
    assert f"seed {bad}: " in (out := capsys.readouterr().out) and "FAILED at iteration 2 (env steps 256)" in out
    assert cli.main(["train", "--resume", str(run), "--ppo.total-steps", "768", "--quiet"]) == 1
    assert f"seed {bad} failed at iteration 2" in capsys.readouterr().err
    assert [r["iteration"] for r in iteration_rows(run) if r.get("seed") == good and rd.FAILURE_KEY not in r] == [
        1, 2, 3, 4, 5, 6]
    assert [r["iteration"] for r in iteration_rows(run) if r.get("seed") == bad and rd.FAILURE_KEY not in r] == [1]
    assert sum(1 for r in rd.read_metrics(run) if r.get("seed") == bad and rd.FAILURE_KEY in r) == 1


def test_library_defaults_are_their_own_not_the_default_presets():
    """``nnx-ppo train`` without a preset starts from ``presets.DEFAULT_CONFIG``
    (a constant learning rate); the default env's preset adds its own learning-rate
    decay without changing the defaults every other task gets."""
    import dataclasses

    from nnx_ppo._app.commands import DEFAULT_TRAIN_CONFIG
    from nnx_ppo.presets import DEFAULT_CONFIG, get_preset

    assert DEFAULT_TRAIN_CONFIG is DEFAULT_CONFIG and not DEFAULT_CONFIG.ppo.learning_rate_decay
    preset = get_preset("cue_memory").config
    assert preset.ppo.learning_rate_decay
    assert dataclasses.replace(preset, ppo=dataclasses.replace(preset.ppo, learning_rate_decay=False)) == DEFAULT_CONFIG


def test_network_defaults_apply_where_no_preset_does():
    """Without a preset (or with ``--no-preset``) a run starts from the library
    defaults of its kind of network: ``NETWORK_DEFAULTS``' entry over
    ``DEFAULT_CONFIG``. Flags still override them, and a preset still wins."""
    from nnx_ppo.presets import DEFAULT_CONFIG, NETWORK_DEFAULTS, get_preset

    lstm = NETWORK_DEFAULTS["lstm"]
    expected = dataclasses.replace(DEFAULT_CONFIG, ppo=dataclasses.replace(DEFAULT_CONFIG.ppo, **lstm["ppo"]))
    for argv in (["train", "gymnax:Acrobot-v1", "--network", "lstm"],
                 ["train", "gymnax:Pendulum-v1", "--network", "lstm", "--no-preset"],
                 ["sweep", "gymnax:Acrobot-v1", "--network", "lstm", "--seeds", "0", "1"]):
        cmd, _ = cli._parse(argv)
        assert json.loads(cmd.setup.network_kwargs) == lstm["network_kwargs"] and cmd.config == expected, argv
    cmd, _ = cli._parse(["train", "gymnax:Acrobot-v1", "--network", "lstm", "--ppo.n-envs", "8",
                         "--network-kwargs", '{"forget_bias": 1.0}'])
    assert (cmd.config.ppo.n_envs, cmd.config.ppo.rollout_length) == (8, lstm["ppo"]["rollout_length"])
    assert json.loads(cmd.setup.network_kwargs) == {"forget_bias": 1.0}
    for network in ("gru", "mlp"):
        cmd, _ = cli._parse(["train", "gymnax:Acrobot-v1", "--network", network])
        assert network in NETWORK_DEFAULTS or (cmd.config == DEFAULT_CONFIG and cmd.setup.network_kwargs is None)
    cmd, _ = cli._parse(["train", "gymnax:Pendulum-v1", "--network", "lstm"])
    assert cmd.config == get_preset("gymnax:Pendulum-v1", "lstm").config and cmd.setup.network_kwargs is None
