"""A sweep member that fails stays failed (issue 34, case 5).

With ``--grid ppo.reward-scale=1e38,1 --pbt-every 2`` members 0 and 1 (reward
scale 1e38) fail at their first iteration, and PBT later copies a healthy
member's state over each (it *revives* it). The failure is recorded in the
run directory (a failure row of ``metrics.jsonl``), so that ``nnx-ppo
eval``, ``sweep.md``/``sweep.json`` and a resumed sweep all carry it; the
lineage names the revival; under PBT the members are ranked one by one,
with their final hyperparameters. One tiny sweep (an MLP of width 8, 8
envs, 6 iterations) serves the command-line tests; the PBT step and the
summary without PBT are checked on hand-made inputs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo.algorithms import checkpointing

TINY = [
    "cue_memory", "--env-kwargs", '{"n_cues": 2, "delay": 2}', "--network", "mlp", "--hidden-size", "8",
    "--ppo.n-envs", "8", "--ppo.n-minibatches", "2", "--ppo.rollout-length", "16", "--ppo.n-epochs", "1",
    "--eval.n-envs", "8", "--eval.max-episode-length", "16", "--ppo.total-steps", "768",
    "--eval.every-steps", "256", "--checkpoint-every-steps", "512",
]
FAILED = (0, 1)  # reward scale 1e38: non-finite at iteration 1
HEALTHY = (2, 3)
MARK = re.compile(r"FAILED at iteration 1 \(env steps 128\): non-finite values")
REVIVED = re.compile(r"revived from member (\d) at iteration (\d+)")


@pytest.fixture(scope="module")
def failed_sweep(tmp_path_factory) -> tuple[Path, int]:
    """The sweep's run directory and exit code."""
    run = tmp_path_factory.mktemp("failed") / "run"
    code = cli.main(["sweep", *TINY, "--grid", "ppo.reward-scale=1e38,1", "--seeds", "0", "1",
                     "--pbt-every", "2", "--run-dir", str(run), "--quiet"])
    return run, code


def _revivals(run: Path) -> dict[int, tuple[int, int]]:
    """Per member, (source, iteration) of its revival, from sweep.json."""
    members = json.loads((run / "sweep.json").read_text())["members"]
    return {m["member"]: (e["from"], e["iteration"]) for m in members for e in m["lineage"] if e["revived"]}


def test_the_failures_are_recorded_in_the_run_directory(failed_sweep):
    run, code = failed_sweep
    assert code == 1  # members failed (the others trained on)
    rows = rd.read_metrics(run)
    failures = [r for r in rows if rd.FAILURE_KEY in r]
    assert sorted(r["seed"] for r in failures) == list(FAILED)  # one row each
    assert all(r["iteration"] == 1 and r["env_steps"] == 128 and r["failure_type"] == "NonFiniteError"
               for r in failures)
    assert not any("train/episode_return" in r for r in rows if r.get("seed") in FAILED)  # no rows after it
    revivals = _revivals(run)
    assert sorted(revivals) == list(FAILED)  # PBT copied a state over each (the failed rank last)
    assert all(iteration % 2 == 0 and iteration > 1 for _, iteration in revivals.values())


def test_eval_marks_the_failed_members_and_their_revival(failed_sweep, capsys):
    run, _ = failed_sweep
    revivals = _revivals(run)
    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0
    lines = {int(m.group(1)): line for line in capsys.readouterr().out.splitlines()
             if (m := re.match(r"\s+member (\d)", line))}
    for i in FAILED:
        source, iteration = revivals[i]
        assert f"member {i} (seed {i}, reward_scale 1e+38, revived from member {source} at iteration {iteration})" \
            in lines[i]
        assert "return  mean" in lines[i] and MARK.search(lines[i]), lines[i]
    for i in HEALTHY:
        assert "FAILED" not in lines[i] and "revived" not in lines[i], lines[i]
    # The best policy: the failed members saved none (they failed before an evaluation); they say so.
    assert cli.main(["eval", str(run), "--episodes", "2", "--best"]) == 0
    out = capsys.readouterr().out
    for i in FAILED:
        line = next(line for line in out.splitlines() if line.strip().startswith(f"member {i} "))
        assert "no best policy" in line and MARK.search(line), line


def test_sweep_md_and_json_rank_members_by_final_hyperparameters_with_lineage_and_failures(failed_sweep):
    run, _ = failed_sweep
    summary = json.loads((run / "sweep.json").read_text())
    members = summary["members"]
    for i in FAILED:
        assert members[i]["failure"]["iteration"] == 1 and "non-finite" in members[i]["failure"]["reason"]
        assert np.isnan(members[i]["final"])  # a failed member has no final return
    assert all(members[i]["failure"] is None for i in HEALTHY)
    assert summary["member_ranking"][-2:] in ([0, 1], [1, 0])  # failed members last
    healthy = summary["member_ranking"][:2]
    assert [members[i]["final"] for i in healthy] == sorted((members[i]["final"] for i in healthy), reverse=True)
    rows = [r for r in rd.read_metrics(run) if "hyperparameters/reward_scale" in r]
    for i in HEALTHY:  # the final values, as logged
        last = [r for r in rows if r["seed"] == i][-1]["hyperparameters/reward_scale"]
        assert members[i]["hyperparameters"]["reward_scale"] == last
    table = (run / "sweep.md").read_text()
    assert "| rank | member | seed | reward_scale |" in table and "lineage" in table
    assert "| rank | config |" not in table  # not the configs, by their starting values
    ranked = [int(m.group(1)) for m in re.finditer(r"^\| \d \| (\d) \|", table, re.M)]
    assert ranked == summary["member_ranking"]
    for i in FAILED:
        line = next(line for line in table.splitlines() if line.startswith(f"| {ranked.index(i) + 1} | {i} |"))
        source, iteration = _revivals(run)[i]
        assert f"revived from member {source} at iteration {iteration}" in line and MARK.search(line), line
    for i in HEALTHY:
        final = members[i]["hyperparameters"]["reward_scale"]
        line = next(line for line in table.splitlines() if line.startswith(f"| {ranked.index(i) + 1} | {i} |"))
        assert line.split(" | ")[3] in (f"{final:g}", f"1 → {final:g}"), line  # start → final value


def test_a_resumed_sweep_keeps_its_failed_members(failed_sweep, tmp_path, capsys):
    run, _ = failed_sweep
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / rd.CHECKPOINT_DIR / "step_000000000768")  # back to step 512, after both revivals
    assert cli.main(["sweep", "--resume", str(copy), "--quiet"]) == 1
    assert "members [0, 1] failed" in capsys.readouterr().err
    failures = [r for r in rd.read_metrics(copy) if rd.FAILURE_KEY in r]
    assert sorted(r["seed"] for r in failures) == list(FAILED)  # kept, not written again
    summary = json.loads((copy / "sweep.json").read_text())
    assert [m["member"] for m in summary["members"] if m["failure"]] == list(FAILED)
    assert _revivals(copy) == _revivals(run)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _State:
    """The parts of a TrainingState that PBT reads (leaves ``[N, ...]``)."""

    params: jax.Array
    key: jax.Array
    iteration: jax.Array
    member: object


def test_pbt_replaces_a_failing_member_and_never_copies_it():
    """Member 0's iteration failed (its returns are infinite, its score was
    the best): it scores nothing, is replaced first, and is no source."""
    from nnx_ppo.algorithms._hyperparameters import MemberState
    from nnx_ppo.algorithms.population import PBTConfig, failed_member_row, population_step
    from nnx_ppo.algorithms.ppo import Health, IterationOutput

    n = 4
    ok = jnp.asarray([False, True, True, True])
    state = _State(params=jnp.arange(n, dtype=jnp.float32), key=jax.random.split(jax.random.key(0), n),
                   iteration=jnp.full(n, 2, jnp.int32),
                   member=MemberState(hyperparameters={"learning_rate": jnp.full(n, 1e-3)},
                                      score=jnp.asarray([9.0, 1.0, 3.0, 2.0]), parent=jnp.arange(n, dtype=jnp.int32)))
    health = Health(finite_obs=jnp.ones(n, bool), finite_reward=jnp.ones(n, bool), finite_loss=ok,
                    replay_error=jnp.zeros(n), replay_ok=jnp.ones(n, bool))
    output = IterationOutput(health=health, metrics={"train/episode_return": jnp.asarray([jnp.inf, 1.0, 3.0, 2.0]),
                                                     "train/completed_episodes": jnp.ones(n)})
    step = population_step(PBTConfig(every_iterations=2, fraction=0.25), ("learning_rate",))
    new, out = step(state, output)
    took_over = np.asarray(out.metrics["population/took_over"]).tolist()
    assert took_over == [2, -1, -1, -1]  # the failing member took over the best healthy one
    assert float(new.params[0]) == 2.0 and np.asarray(new.member.parent).tolist() == [2, 1, 2, 3]
    assert np.isfinite(np.asarray(out.metrics["population/score"])).all()
    row = {k: float(np.asarray(v)[0]) for k, v in out.metrics.items()}
    assert failed_member_row(row) == {"population/took_over": 2.0, "population/parent": 2.0}
    assert failed_member_row({**row, "population/took_over": -1.0}) is None


def test_without_pbt_configs_with_failed_members_rank_last(tmp_path):
    """The config ranking (no PBT): a failed member's last evaluation is no
    final return, and its config ranks below those without failures."""
    from nnx_ppo._app.sweep import TABLE_FILE, format_table, sweep_summary, write_outputs

    members = [{"seed": s, "hyperparameters": {"learning_rate": lr}} for lr in (1e-2, 1e-3) for s in (0, 1)]
    rd.write_run_config(tmp_path, {"env": "cue_memory", "network": {}, "members": members,
                                   "population": {"configs": 2, "seeds": [0, 1], "pbt": None}})
    returns = {0: (5.0, 9.0), 1: (5.0, 9.0), 2: (1.0, 2.0), 3: (1.0, 2.0)}
    rows = [{"env_steps": s, "seed": i, "eval": True, "eval/episode_return": returns[i][k]}
            for k, s in enumerate((128, 256)) for i in range(4)]
    rows = [r for r in rows if not (r["seed"] == 0 and r["env_steps"] == 256)]  # member 0 failed at iteration 2
    rows.append({"env_steps": 256, "seed": 0, "iteration": 2, rd.FAILURE_KEY: "non-finite values (NaN or inf) in "
                 "the loss at iteration 2", "failure_type": "NonFiniteError"})
    (tmp_path / rd.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = sweep_summary(tmp_path)
    assert [c["config"] for c in summary["configs"]] == [1, 0] and summary["configs"][1]["failed"] == [0]
    assert summary["configs"][1]["final"] == 9.0  # its members that did not fail
    assert summary["member_ranking"] is None and np.isnan(summary["members"][0]["final"])
    assert format_table(summary).splitlines()[-1].endswith("| 0 |")  # the failed members column
    write_outputs(tmp_path, summary)
    table = (tmp_path / TABLE_FILE).read_text()
    assert "| 0 | 0 | 0.01 | - | 5.000 | FAILED at iteration 2 (env steps 256): non-finite values" in table


def test_a_plain_run_is_a_member_of_its_own(tmp_path, capsys):
    """One plain run fails the way a member does (issue 34, point 1: one code
    path for 1..N members): its failure is a failure row of metrics.jsonl, its
    last checkpoint holds its last healthy state, and ``eval`` marks it."""
    run = tmp_path / "run"
    assert cli.main(["train", *TINY, "--ppo.reward-scale", "1e38", "--run-dir", str(run), "--quiet"]) == 1
    assert "non-finite values" in capsys.readouterr().err
    # the final checkpoint is named by the steps its state holds (the iteration before the failure)
    assert [step for step, _ in checkpointing.list_checkpoints(run / rd.CHECKPOINT_DIR)] == [0]
    failures = rd.failure_rows(rd.read_metrics(run))
    assert list(failures) == [None]
    assert failures[None]["iteration"] == 1 and failures[None]["failure_type"] == "NonFiniteError"
    assert not [r for r in rd.read_metrics(run) if r.get("eval")]  # no member left to evaluate
    assert cli.main(["eval", str(run), "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert MARK.search(out) and "mean nan" not in out, out  # (the last healthy parameters)
