"""``nnx-ppo sweep``: a grid x seeds as one population, its run directory,
ranked table, plots, members for eval/load_policy, PBT and exact resume.
Budgets are tiny (8 envs, an LSTM of width 8, 8 iterations)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo._app.commands import CliError
from nnx_ppo._app.sweep import grid_configs, parse_grid
from nnx_ppo.algorithms.config import TrainConfig
from nnx_ppo.network_spec import load_network

TINY = [
    "cue_memory", "--env-kwargs", '{"n_cues": 2, "delay": 2}', "--network", "lstm", "--hidden-size", "8",
    "--ppo.n-envs", "8", "--ppo.n-minibatches", "2", "--ppo.rollout-length", "16", "--ppo.n-epochs", "1",
    "--eval.n-envs", "8", "--eval.max-episode-length", "16", "--ppo.total-steps", "1024",
    "--eval.every-steps", "256", "--checkpoint-every-steps", "512",
]


def test_grid_parsing_names_bad_entries():
    assert parse_grid(["ppo.learning-rate=1e-3,3e-4", "--ppo.gae-lambda=0.9"]) == {
        "learning_rate": [1e-3, 3e-4], "gae_lambda": [0.9]}
    for bad, message in (("ppo.n-envs=8,16", "cannot differ between the members"),
                         ("learning-rate=1e-3", "expected FIELD=V1,V2"),
                         ("ppo.learning-rate=fast", "needs numbers"),
                         ("ppo.clip-range=0.1,0.1", "repeats a value")):
        with pytest.raises(CliError, match=message):
            parse_grid([bad])
    configs, values = grid_configs(TrainConfig(), parse_grid(["ppo.learning-rate=1e-3,3e-4", "ppo.clip-range=0.1,0.2"]))
    assert [(c.ppo.learning_rate, c.ppo.clip_range) for c in configs] == [
        (1e-3, 0.1), (1e-3, 0.2), (3e-4, 0.1), (3e-4, 0.2)]
    assert values[1] == {"learning_rate": 1e-3, "clip_range": 0.2}
    with pytest.raises(CliError, match="learning_rate must be a positive"):
        grid_configs(TrainConfig(), parse_grid(["ppo.learning-rate=-1"]))


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sweep") / "run"
    code = cli.main(["sweep", *TINY, "--grid", "ppo.learning-rate=3e-3,3e-4", "--seeds", "0", "1",
                     "--pbt-every", "2", "--threshold", "0.9", "--run-dir", str(run), "--quiet"])
    assert code == 0
    return run


def test_sweep_writes_members_table_and_plots(sweep_run: Path):
    saved = rd.read_run_config(sweep_run)
    assert [m["seed"] for m in saved["members"]] == [0, 1, 0, 1]
    assert [m["hyperparameters"]["learning_rate"] for m in saved["members"]] == [3e-3, 3e-3, 3e-4, 3e-4]
    rows = rd.read_metrics(sweep_run)
    assert {r["seed"] for r in rows} == {0, 1, 2, 3}  # one row per member and step
    lineage = [r for r in rows if not r.get("eval")]
    assert all("population/parent" in r and "hyperparameters/learning_rate" in r for r in lineage)
    summary = json.loads((sweep_run / "sweep.json").read_text())
    assert summary["fields"] == ["learning_rate"] and len(summary["configs"]) == 2
    iqms = [c["iqm_final"] for c in summary["configs"]]
    assert iqms == sorted(iqms, reverse=True)  # ranked
    for c in summary["configs"]:
        finals = [m["final"] for m in summary["members"] if m["member"] in c["members"]]
        assert c["final"] == pytest.approx(np.mean(finals))
        lo, hi = c["iqm_interval"]
        assert lo <= c["iqm_final"] <= hi
    finals = [summary["members"][i]["final"] for i in summary["member_ranking"]]
    assert sorted(summary["member_ranking"]) == [0, 1, 2, 3] and finals == sorted(finals, reverse=True)
    assert all(m["failure"] is None and set(m["hyperparameters"]) >= {"learning_rate"} for m in summary["members"])
    table = (sweep_run / "sweep.md").read_text()  # with PBT: the members ranked, with their final values and lineage
    assert "| rank | member | seed | learning_rate |" in table and "steps to 0.9" in table and "lineage" in table
    for name in ("sweep_learning_rate.png", "pbt_learning_rate.png", "learning_curve.png"):
        assert (sweep_run / name).stat().st_size > 1000


def test_eval_and_load_policy_take_a_member(sweep_run: Path, capsys):
    from nnx_ppo import load_policy

    assert cli.main(["eval", str(sweep_run), "--member", "2", "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "member 2 (seed 0, learning_rate 0.0003)" in out and "member 1" not in out
    assert cli.main(["eval", str(sweep_run), "--member", "4"]) == 2
    policy = load_policy(sweep_run, member=3, step="best")
    assert policy is not None
    with pytest.raises(ValueError, match="not both"):
        load_policy(sweep_run, member=3, seed=1)


def test_sweep_resumes_exactly(sweep_run: Path, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sweep_run, copy)
    shutil.rmtree(copy / rd.CHECKPOINT_DIR / "step_000000001024")  # back to the checkpoint at step 512
    assert cli.main(["sweep", "--resume", str(copy), "--quiet"]) == 0
    before = json.loads((sweep_run / "sweep.json").read_text())["members"]
    after = json.loads((copy / "sweep.json").read_text())["members"]
    assert [m["final"] for m in after] == [m["final"] for m in before]
    for member in range(4):  # every member's parameters, PBT's copies and perturbations included: exact
        a, b = (nnx.state(load_network(run, member=member), nnx.Param) for run in (sweep_run, copy))
        jax.tree.map(np.testing.assert_array_equal, a, b)
    assert cli.main(["sweep", "--resume", str(sweep_run / "nowhere"), "--quiet"]) == 2


def test_a_population_resumes_only_with_its_members(sweep_run: Path):
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig
    from nnx_ppo.algorithms.population import train_population
    from nnx_ppo.envs import make
    from nnx_ppo.network_spec import NetworkSpec

    saved = rd.read_run_config(sweep_run)
    spec = NetworkSpec.from_dict(saved["network"])
    config = TrainConfig(ppo=PPOConfig(n_envs=8, n_minibatches=2, rollout_length=16, n_epochs=1, total_steps=2048,
                                       learning_rate=3e-3), eval=EvalConfig(enabled=False))
    with pytest.raises(ValueError, match="resume with its configs and seeds"):  # refused before anything compiles
        train_population(make("cue_memory", n_cues=2, delay=2), spec, [config], [0, 1],
                         resume_from=str(sweep_run / rd.CHECKPOINT_DIR))


def test_sweep_refuses_a_train_run_and_a_missing_grid(tmp_path, capsys):
    assert cli.main(["sweep", *TINY, "--run-dir", str(tmp_path / "r")]) == 2
    assert "give --grid" in capsys.readouterr().err


def test_resume_keeps_the_network_kwargs(tmp_path):
    """A run trained with --network-kwargs resumes with them (they are not among the sized kwargs)."""
    from nnx_ppo._app.train import resume_defaults
    from nnx_ppo.algorithms.config import config_to_dict

    run = tmp_path / "run"
    run.mkdir()
    network = {"env": "cue_memory_long", "kind": "lstm", "seed": 0, "env_kwargs": {}, "hidden_size": 32,
               "kwargs": {"hidden_size": 32, "encoder_sizes": [32], "forget_bias": 3.0}}
    (run / rd.CONFIG_FILE).write_text(json.dumps({"env": "cue_memory_long", "env_kwargs": {}, "network": network,
                                                  "config": config_to_dict(TrainConfig())}))
    cmd, _ = resume_defaults(str(run))
    assert json.loads(cmd.setup.network_kwargs) == {"forget_bias": 3.0} and cmd.setup.hidden_size == 32
