"""A researcher's own env through every command, with no wrapper script
(issue 52): ``nnx-ppo train path/to/file.py:CLASS`` and ``MODULE:CLASS``,
the run's copy of the user's files, env sources declared by installed
packages, and run directories that are never cleared or taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd

TMAZE = textwrap.dedent('''
    """A T-maze: a cue (left or right) at the first step, the choice at the end of the corridor."""
    import jax
    import jax.numpy as jnp

    from nnx_ppo.envs import Box, Discrete, EnvState, RLEnv


    class TMaze(RLEnv):
        def __init__(self, length: int = 3):
            self.length = length

        @property
        def observation_space(self):
            return Box((3,))

        @property
        def action_space(self):
            return Discrete(2)

        def _obs(self, cue, t):
            shown = jnp.where(t == 0, jnp.where(cue == 0, -1.0, 1.0), 0.0)
            return jnp.stack([shown, (t == self.length).astype(jnp.float32), t / self.length])

        def reset(self, key):
            cue = jax.random.bernoulli(key).astype(jnp.int32)
            t = jnp.int32(0)
            return EnvState(obs=self._obs(cue, t), reward=jnp.float32(0.0), done=jnp.float32(0.0), metrics={},
                            info={"truncated": jnp.float32(0.0)}, data={"cue": cue, "t": t})

        def step(self, state, action):
            t = state.data["t"] + 1
            end = t > self.length
            reward = jnp.where(end, jnp.where(action == state.data["cue"], 1.0, 0.0), 0.0)
            return state.replace(obs=self._obs(state.data["cue"], t), reward=reward.astype(jnp.float32),
                                 done=end.astype(jnp.float32), data={"cue": state.data["cue"], "t": t})
''')

TINY = ["--network", "lstm", "--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "2",
        "--ppo.rollout-length", "8", "--ppo.n-epochs", "1", "--eval.n-envs", "4", "--eval.max-episode-length", "8",
        "--eval.every-steps", "128", "--quiet"]


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A run of ``tmaze.py:TMaze`` (a relative path, from its folder) with
    ``--env-kwargs``; the working directory is restored afterwards."""
    home = tmp_path_factory.mktemp("own")
    (home / "tmaze.py").write_text(TMAZE)
    before = os.getcwd()
    os.chdir(home)
    try:
        code = cli.main(["train", "tmaze.py:TMaze", "--env-kwargs", '{"length": 2}', *TINY,
                         "--ppo.total-steps", "256", "--run-dir", "run"])
    finally:
        os.chdir(before)
    assert code == 0
    return home


def test_the_run_records_the_env_by_its_file_and_keeps_a_copy(own_run: Path):
    saved = rd.read_run_config(own_run / "run")
    spec = f"{own_run / 'tmaze.py'}:TMaze"
    assert saved["env"] == spec and saved["env_kwargs"] == {"length": 2}
    assert saved["source"][spec]["copy"] == "source/tmaze.py"
    assert (own_run / "run" / "source" / "tmaze.py").read_text() == TMAZE
    import hashlib

    assert saved["source"][spec]["sha256"] == hashlib.sha256(TMAZE.encode()).hexdigest()


def test_every_command_works_on_the_run_with_plain_nnx_ppo(own_run: Path, tmp_path, capsys):
    run = own_run / "run"  # (from another working directory: the spec is absolute)
    assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 deterministic episodes" in out and "length  mean 3.0" in out  # length 2: the choice at step 3
    assert cli.main(["eval", str(run), "--list-modules"]) == 0
    assert cli.main(["eval", str(run), "--episodes", "2", "--record-activations", "layers/0",
                     "--out", str(tmp_path / "acts.npz")]) == 0
    assert (tmp_path / "acts.npz").is_file()
    assert cli.main(["export", str(run), "--out", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "step.jax").is_file()
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "curve.png")]) == 0
    assert cli.main(["distill", str(run), "--network", "gru", "--hidden-size", "8", "--total-steps", "128",
                     "--run-dir", str(tmp_path / "student"), "--quiet"]) == 0
    assert rd.read_run_config(tmp_path / "student")["env"] == rd.read_run_config(run)["env"]
    assert cli.main(["resume", str(run), "--ppo.total-steps", "384"]) == 0
    assert [r["env_steps"] for r in rd.read_metrics(run) if not r.get("eval")][-1] == 384


def test_a_sweep_on_a_module_env(tmp_path, monkeypatch, capsys):
    """A one-config sweep (two seeds) of ``package.module:CLASS``, found from
    the working directory; it ends without an empty ``plots:``."""
    (tmp_path / "mazes").mkdir()
    (tmp_path / "mazes" / "__init__.py").write_text("")
    (tmp_path / "mazes" / "tmaze.py").write_text(TMAZE)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "mazes.tmaze:TMaze", *TINY, "--ppo.total-steps", "128", "--grid",
                     "ppo.learning-rate=1e-3", "--seeds", "0", "1", "--run-dir", "sweep"]) == 0
    out = capsys.readouterr().out
    assert "table: sweep/sweep.md" in out and "plots:" not in out
    saved = rd.read_run_config(tmp_path / "sweep")
    assert saved["env"] == "mazes.tmaze:TMaze" and saved["source"]["mazes.tmaze:TMaze"]["copy"] == "source/tmaze.py"
    assert cli.main(["eval", "sweep", "--episodes", "2"]) == 0


def _copy_run(own_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The run and its env file, copied, so that a test can change or move the file."""
    import shutil

    home = tmp_path / "home"
    shutil.copytree(own_run, home)
    saved = rd.read_run_config(home / "run")
    old = saved["env"]
    new = f"{home / 'tmaze.py'}:TMaze"
    saved["env"], saved["source"] = new, {new: {**saved["source"][old], "file": str(home / "tmaze.py")}}
    rd.write_run_config(home / "run", saved)
    return home / "run", home / "tmaze.py"


def test_a_changed_or_moved_env_file_is_said_and_the_copy_used(own_run: Path, tmp_path, capsys):
    run, env_file = _copy_run(own_run, tmp_path)
    env_file.write_text(TMAZE + "\nraise RuntimeError('edited since')\n")
    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0  # from the copy: the edit never runs
    err = capsys.readouterr().err
    assert f"{env_file} has changed since the run was trained; using the run's copy" in err
    assert cli.main(["eval", str(run), "--episodes", "2", "--current-code"]) == 2  # the file as it is now
    assert "edited since" in capsys.readouterr().err
    env_file.unlink()
    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0
    assert f"{env_file} no longer exists; using the run's copy" in capsys.readouterr().err


def test_an_env_only_a_script_registered_is_refused_in_one_line(own_run: Path, tmp_path, capsys):
    run, _ = _copy_run(own_run, tmp_path)
    saved = rd.read_run_config(run)
    saved["env"] = "tmaze"  # what `register("tmaze", TMaze)` in a script records
    rd.write_run_config(run, saved)
    for command in (["eval", str(run)], ["export", str(run), "--out", str(tmp_path / "x")], ["resume", str(run)]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "which the script that trained it registered" in err, err
        assert "path/to/file.py:CLASS" in err


def test_an_env_file_imports_its_sibling_modules(tmp_path, monkeypatch):
    """A file env that imports a helper next to it, loaded from another working directory."""
    from nnx_ppo import envs

    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "maze_parts.py").write_text(TMAZE)
    (tmp_path / "lab" / "my_env.py").write_text("from maze_parts import TMaze\n\n\ndef long_maze():\n"
                                                "    return TMaze(length=5)\n")
    monkeypatch.chdir(tmp_path)
    assert envs.make(f"{tmp_path / 'lab' / 'my_env.py'}:long_maze").length == 5
    assert str(tmp_path / "lab") not in __import__("sys").path


def test_env_spec_errors_are_one_line_with_a_suggestion(tmp_path, capsys):
    from nnx_ppo import envs

    with pytest.raises(ValueError, match=r"did you mean 'cue_memory'\?"):
        envs.make("cue_memroy")
    with pytest.raises(ValueError, match=r"did you mean 'gymnax:CartPole-v1'\?"):
        envs.make("gymax:CartPole-v1")
    assert cli.main(["train", str(tmp_path / "none.py") + ":TMaze", "--run-dir", str(tmp_path / "r")]) == 2
    assert "no file" in capsys.readouterr().err
    (tmp_path / "t.py").write_text(TMAZE)
    assert cli.main(["train", f"{tmp_path / 't.py'}:TMase", "--run-dir", str(tmp_path / "r")]) == 2
    assert "has no class or function 'TMase'" in capsys.readouterr().err


def test_an_installed_package_declares_an_env_source(tmp_path):
    """A package with an ``nnx_ppo.env_sources`` entry point, installed (its
    dist-info on the path, as pip leaves it): ``nnx-ppo envs`` lists it and
    ``make`` builds its envs by name."""
    site = tmp_path / "site"
    (site / "mazelab").mkdir(parents=True)
    (site / "mazelab" / "__init__.py").write_text(TMAZE + textwrap.dedent('''

        def source(name, episode_length=20, **kwargs):
            """T-mazes from the maze lab (mazelab:tmaze)."""
            from nnx_ppo.envs import TimeLimit

            if name != "tmaze":
                raise ValueError(f"mazelab has no {name!r}")
            return TimeLimit(TMaze(**kwargs), episode_length)

        source.examples = ("mazelab:tmaze",)
    '''))
    info = site / "mazelab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mazelab\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[nnx_ppo.env_sources]\nmazelab = mazelab:source\n")
    (info / "RECORD").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    listed = subprocess.run([sys.executable, "-m", "nnx_ppo.cli", "envs"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "mazelab:" in listed.stdout and "T-mazes from the maze lab" in listed.stdout
    assert "e.g. mazelab:tmaze" in listed.stdout
    built = subprocess.run([sys.executable, "-c", "from nnx_ppo import envs; e = envs.make('mazelab:tmaze', "
                            "length=4, episode_length=9); print(type(e).__name__, e.env.length, e.max_steps)"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert built.returncode == 0, built.stderr
    assert built.stdout.split() == ["TimeLimit", "4", "9"]


# ----------------------------------------------------------------------------- nothing of a run lost


def test_a_finished_run_without_its_checkpoints_is_not_wiped(own_run: Path, tmp_path, capsys):
    import shutil

    run, _ = _copy_run(own_run, tmp_path)
    shutil.rmtree(run / "checkpoints")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert cli.main(["train", *TINY, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already holds a run (config.json," in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert cli.main(["train", *TINY, "--ppo.total-steps", "128", "--run-dir", str(run), "--overwrite"]) == 0
    assert rd.read_run_config(run)["env"] == "cue_memory" and not (run / "source").exists()


def test_a_foreign_run_directory_is_refused(tmp_path, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text('{"lr": 0.1}')
    (theirs / "metrics.jsonl").write_text('{"step": 1}\n')
    assert cli.main(["train", *TINY, "--run-dir", str(theirs)]) == 2
    assert "holds a config.json that is no nnx-ppo run's" in capsys.readouterr().err
    assert (theirs / "config.json").read_text() == '{"lr": 0.1}'
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "plan.txt").write_text("x")
    assert cli.main(["train", *TINY, "--run-dir", str(notes)]) == 2
    assert "holds files that no run writes (plan.txt)" in capsys.readouterr().err


def test_a_run_with_only_its_best_policy_left(own_run: Path, tmp_path, capsys):
    import shutil

    run, _ = _copy_run(own_run, tmp_path)
    for step in (run / "checkpoints").glob("step_*"):
        shutil.rmtree(step)
    assert (run / "checkpoints" / "best").is_dir()
    assert cli.main(["eval", str(run), "--best", "--episodes", "2"]) == 0
    assert "best evaluated policy" in capsys.readouterr().out
    assert cli.main(["export", str(run), "--best", "--out", str(tmp_path / "best")]) == 0
    assert cli.main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "only its best policy" in err and "give --best" in err
    assert cli.main(["resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "only its best policy" in err and "--best" in err and "--overwrite" in err
    assert cli.main(["train", *TINY, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "cannot be resumed (only its best policy is left" in err and "resume" not in err.split("cannot")[0]
    assert json.loads((run / "config.json").read_text())["env"].endswith("tmaze.py:TMaze")


def test_a_config_too_large_for_the_memory_is_refused_before_anything_is_allocated(tmp_path, monkeypatch, capsys):
    """The estimate comes from shapes: with the memory said to be 1 MB, 1024
    envs are refused in one line giving the estimate (exit 2), and the run
    directory gets no config.json; a config that trains >10x the steps asked
    for (whole iterations) is warned about."""
    from flax import nnx

    from nnx_ppo.algorithms import ppo
    from nnx_ppo.algorithms.config import PPOConfig
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = make("cue_memory")
    network = make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=8, encoder_sizes=[8])
    small = ppo.estimate_bytes(env, network, 8, 16)
    assert ppo.estimate_bytes(env, network, 80, 16) == 10 * small > 0
    monkeypatch.setattr(ppo, "available_bytes", lambda device=None: (10**6, "test memory"))
    assert cli.main(["train", *TINY, "--ppo.n-envs", "1024", "--run-dir", str(tmp_path / "big")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs at least" in err and "than the 1 MB of test memory" in err
    assert "n_envs 1,024 x rollout_length 8" in err and "lower n_envs" in err
    assert not (tmp_path / "big" / "config.json").exists()
    with pytest.warns(ppo.FootprintWarning, match=r"total_steps 100 is rounded up to one iteration of 1,024"):
        ppo.check_footprint(env, network, PPOConfig(n_envs=64, rollout_length=16, total_steps=100))
