"""A suite of tasks the library's defaults are chosen on (issue 35, point 2).

Usage:
    python bench/suite.py list
    python bench/suite.py run [--tasks T ...] [--networks N ...] [--seeds 0 1 2 3 4]
                              [--label defaults] [--extra-args "--ppo.rollout-length 96"]
                              [--out bench/results/suite.jsonl] [--dry-run]
    python bench/suite.py random [--tasks T ...] [--episodes 1024]
    python bench/suite.py report [--out bench/results/suite.jsonl] [--labels L ...] [--baseline L] [--no-readme]

Every task is one for which the library ships no preset: memory tasks
(gymnax's bsuite MemoryChain at memory lengths inside and past the default
24-step rollout, classic control tasks with their velocities hidden through
``make``'s ``hide_obs``, MinAtar Breakout without its trail channel,
XLand-MiniGrid's MiniGrid-MemoryS8) trained with ``--network lstm`` and
``--network gru``, and control tasks (gymnax classic control, bsuite Catch,
MinAtar, MuJoCo Playground's dm_control tasks) trained with ``--network mlp``.
Each task has a step budget sized for this project's 2-core CPU (a run of
1-5 minutes alone), a success threshold and the random and maximum scores
that normalize its returns: ``(return - random) / (max - random)``.

``run`` trains each (task, network, seed) through the command line, one
process per seed, with the library's defaults (``nnx-ppo train ENV
--no-preset --network N --seed S --ppo.total-steps BUDGET ...``), then
evaluates its final policy on 128 fresh deterministic episodes (``nnx-ppo
eval RUN --episodes 128``) and appends one JSON row to ``--out``: the
commands, the git commit, wall times, the evaluation's mean/std/min/max,
whether the mean reached the threshold, the env steps trained. Seeds come
outermost (seed 0 of every task and network, then seed 1, ...), so a partial
run covers every task. A (task, network, seed, label) already in the file is
skipped, so an interrupted ``run`` continues where it stopped and loses at
most the run in progress (its run directory is started again). ``--label``
names a candidate set of defaults and ``--extra-args`` gives the flags that
make it, appended to every ``train`` command (e.g. ``--label lstm_forget3
--extra-args "--network-kwargs '{\"forget_bias\": 3.0}'"``: the flags are split as
a shell splits them, so JSON keeps its quotes inside single quotes).

``report`` prints per label: the fraction of (task, network) pairs solved
(a majority of their seeds reach the threshold) and of runs solved, the
median and the interquartile mean (IQM: the mean of the middle 50% of runs)
of the normalized scores with stratified bootstrap 95% intervals (seeds
resampled within each task and network), a per-task table, and a plot
(``bench/results/suite.png``); it rewrites the results section of
bench/README.md between its markers.

The ``xminigrid:`` task runs through ``bench/suite_envs.py``, the same
command line with an XLand-MiniGrid env source registered
(``pip install "nnx_ppo[bench]"``); every other task through ``nnx-ppo``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "suite.jsonl"
PLOT = HERE / "results" / "suite.png"
README = HERE / "README.md"
RUNS = ROOT / "runs" / "suite"
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
EPISODES = 128  # fresh episodes of the final evaluation
EVAL_SEED = 1000  # seeds `nnx-ppo eval`'s env resets: the same fresh episodes for every run and label
SEEDS = (0, 1, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of the suite.

    Attributes:
      name: the suite's short name.
      kind: ``"memory"`` (trained with lstm and gru) or ``"control"`` (mlp).
      env: the env spec given to ``nnx-ppo train``.
      env_kwargs: its ``--env-kwargs``.
      budget: env steps to train (``--ppo.total-steps``).
      threshold: a final evaluation mean at or above it solves the task.
      random: the return of a uniformly random policy (normalized to 0).
      best: the best reachable return (normalized to 1).
      why: where the threshold, random and best scores come from.
      steps_per_s: measured training env steps/s of a tiny run (see the README), for ``list``.
      launcher: ``"nnx-ppo"``, or ``"suite_envs"`` for ``bench/suite_envs.py`` (an extra env source).
    """

    name: str
    kind: str
    env: str
    env_kwargs: dict
    budget: int
    threshold: float
    random: float
    best: float
    why: str
    steps_per_s: float = 0.0
    launcher: str = "nnx-ppo"

    @property
    def networks(self) -> tuple[str, ...]:
        """The networks it is trained with: lstm and gru for memory, mlp for control."""
        return ("lstm", "gru") if self.kind == "memory" else ("mlp",)

    def normalize(self, value: float) -> float:
        """``value`` on the scale random = 0, best = 1 (not clipped)."""
        return (value - self.random) / (self.best - self.random)


# Sources of the scores. "gym": the reward_threshold of the gym / Gymnasium registration. "blines": the return of
# the trained PPO checkpoint of gymnax-blines, as the gymnax README lists it (the best of each gymnax task; its
# long, tuned runs). "random": measured by `python bench/suite.py random` (1024 episodes of uniform random actions).
_MC = ("bsuite MemoryChain (gymnax, one context bit shown at the first step, asked for at the last): +1 for the "
       "right answer, -1 for the wrong one; random 0, best 1; solved at 0.9 = 95% of the answers right")
_MINATAR = ("MinAtar {game} (gymnax); best: gymnax-blines' PPO checkpoint ({best:g}); no standard 'solved' score: "
            "threshold half of it, provisional (revisit when a sitting shows what a budget of this size reaches)")
_DMC = ("MuJoCo Playground's dm_control {task}: at most 1 reward per step, 1000 steps; best 1000; solved at 800, "
        "the level published state-based agents pass on the easy dm_control tasks")
TASKS: tuple[Task, ...] = (
    # ------------------------------------------------------------------ memory (lstm, gru)
    Task("memory_chain_10", "memory", "gymnax:MemoryChain-bsuite", {"memory_length": 10}, 200_000,
         0.9, 0.0, 1.0, _MC + "; 11-step episodes, inside one 24-step rollout", 24_400),
    Task("memory_chain_30", "memory", "gymnax:MemoryChain-bsuite", {"memory_length": 30}, 500_000,
         0.9, 0.0, 1.0, _MC + "; 31-step episodes, longer than the default 24-step rollout", 24_400),
    Task("memory_chain_100", "memory", "gymnax:MemoryChain-bsuite", {"memory_length": 100}, 1_500_000,
         0.9, 0.0, 1.0, _MC + "; 101-step episodes, 4 rollouts (bsuite's longest memory length)", 17_300),
    Task("cartpole_no_vel", "memory", "gymnax:CartPole-v1", {"hide_obs": [1, 3]}, 2_000_000,
         475.0, 22.6, 500.0,
         "CartPole-v1 with the cart and pole velocities hidden (popgym's StatelessCartPole); threshold: gym's "
         "475; best 500 (the episode limit)", 18_100),
    Task("pendulum_no_vel", "memory", "gymnax:Pendulum-v1", {"hide_obs": [2]}, 2_000_000,
         -250.0, -1215.0, -130.0,
         "Pendulum-v1 without its angular velocity; threshold: the library's Pendulum presets' target -250; "
         "best: gymnax-blines' PPO checkpoint, fully observed (-130)", 15_100),
    Task("acrobot_no_vel", "memory", "gymnax:Acrobot-v1", {"hide_obs": [4, 5]}, 1_500_000,
         -100.0, -499.1, -80.0,
         "Acrobot-v1 without its joint velocities; threshold: gym's -100; best: gymnax-blines' PPO checkpoint, "
         "fully observed (-80)", 21_100),
    Task("breakout_no_trail", "memory", "gymnax:Breakout-MinAtar", {"hide_obs": [2]}, 1_000_000,
         14.0, 0.44, 28.0,
         "MinAtar Breakout without its trail channel, so the ball's direction must be remembered; best and "
         "threshold as for breakout_minatar (fully observed)", 8_100),
    Task("minigrid_memory_s8", "memory", "xminigrid:MiniGrid-MemoryS8", {}, 1_500_000,
         0.9, 0.17, 1.0,
         "XLand-MiniGrid's MiniGrid-MemoryS8 (a 3x3 view): see an object, walk down the corridor, step next "
         "to the matching one of two: reward 1 - 0.9 t / 320, 0 for the other; a memoryless guess scores "
         "under 0.5; best 1; solved at 0.9 (MiniGrid's success level for its reward)", 12_000, "suite_envs"),
    # ------------------------------------------------------------------ control (mlp)
    Task("acrobot", "control", "gymnax:Acrobot-v1", {}, 1_000_000,
         -100.0, -499.1, -80.0, "Acrobot-v1; threshold: gym's -100; best: gymnax-blines' PPO checkpoint (-80)",
         119_000),
    Task("mountain_car_continuous", "control", "gymnax:MountainCarContinuous-v0", {}, 2_000_000,
         90.0, -33.2, 92.0,
         "MountainCarContinuous-v0 (an exploration problem: the action cost pulls towards doing nothing); "
         "threshold: gym's 90; best: gymnax-blines' PPO checkpoint (92)", 152_000),
    Task("breakout_minatar", "control", "gymnax:Breakout-MinAtar", {}, 3_000_000,
         14.0, 0.44, 28.0, _MINATAR.format(game="Breakout", best=28), 15_400),
    Task("space_invaders_minatar", "control", "gymnax:SpaceInvaders-MinAtar", {}, 3_000_000,
         65.0, 4.0, 131.0, _MINATAR.format(game="SpaceInvaders", best=131), 15_200),
    Task("asterix_minatar", "control", "gymnax:Asterix-MinAtar", {}, 2_000_000,
         7.5, 0.53, 15.0, _MINATAR.format(game="Asterix", best=15), 8_400),
    Task("point_mass", "control", "playground:PointMass", {}, 3_000_000,
         800.0, 2.6, 1000.0, _DMC.format(task="PointMass (easy)"), 37_300),
)
TASK_BY_NAME = {t.name: t for t in TASKS}


# ----------------------------------------------------------------------------- running


def run_dir(label: str, task: Task, network: str, seed: int) -> Path:
    """Where one run writes: ``runs/suite/<label>/<task>-<network>-s<seed>`` (git-ignored)."""
    return RUNS / label / f"{task.name}-{network}-s{seed}"


def _rel(path: Path) -> str:
    """``path`` relative to the repository root when it is inside it (the commands run there)."""
    path = Path(path).absolute()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def eval_every_steps(budget: int) -> int:
    """Env steps between the periodic evaluations of a run of ``budget`` steps (10 per run, at least 10k apart)."""
    return max(10_000, budget // 10)


def _cli(task: Task) -> list[str]:
    """The command line that trains and evaluates ``task``: ``nnx-ppo`` (next
    to this Python), or ``bench/suite_envs.py`` for a task of an extra env source."""
    if task.launcher == "suite_envs":
        return [_rel(Path(sys.executable)), _rel(HERE / "suite_envs.py")]
    return [_rel(Path(sys.executable).with_name("nnx-ppo"))]


def train_command(task: Task, network: str, seed: int, directory: Path, extra_args: list[str]) -> list[str]:
    """``nnx-ppo train`` with the library's defaults (``--no-preset``) on ``task``.

    Evaluations during training happen 10 times and checkpoints twice per
    run (they change no learning, only the cost of the run); the final
    policy is what the suite scores.
    """
    return [*_cli(task), "train", task.env, "--no-preset", "--network", network, "--seed", str(seed),
            "--ppo.total-steps", str(task.budget), "--run-dir", _rel(directory),
            *(["--env-kwargs", json.dumps(task.env_kwargs)] if task.env_kwargs else []), "--quiet",
            "--eval.every-steps", str(eval_every_steps(task.budget)),
            "--checkpoint-every-steps", str(max(10_000, task.budget // 2)), *extra_args]


def eval_command(task: Task, directory: Path) -> list[str]:
    """``nnx-ppo eval`` of the run's final policy on ``EPISODES`` fresh deterministic episodes."""
    return [*_cli(task), "eval", _rel(directory), "--episodes", str(EPISODES), "--seed", str(EVAL_SEED)]


_EVAL_LINE = re.compile(r"return\s+mean\s+(\S+)\s+std\s+(\S+)\s+min\s+(\S+)\s+max\s+(\S+)\s+length\s+mean\s+(\S+)")


def parse_eval(stdout: str) -> dict:
    """The statistics of ``nnx-ppo eval``'s ``return  mean M  std S  min A  max B  length  mean L`` line
    (it has no machine-readable output); raises ValueError if there is none."""
    matches = _EVAL_LINE.findall(stdout)
    if not matches:
        raise ValueError(f"no 'return mean ... std ...' line in nnx-ppo eval's output:\n{stdout[-2000:]}")
    mean, std, lo, hi, length = (float(v) for v in matches[-1])
    return {"eval_mean": mean, "eval_std": std, "eval_min": lo, "eval_max": hi, "eval_length": length}


def _trained(directory: Path) -> dict:
    """From the run's metrics.jsonl: env steps trained, the median steady
    training env steps/s, and the periodic evaluations as ``[env_steps,
    mean return, training seconds]`` (the training clock, compilation
    included, at the iteration the evaluation followed), so that a row keeps
    its learning curve when the run directory is gone."""
    steps, rates, elapsed, evals = 0, [], 0.0, []
    path = directory / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            steps = max(steps, int(row.get("env_steps", 0)))
            if "time/steps_per_second" in row:
                rates.append(float(row["time/steps_per_second"]))
            if isinstance(row.get("time/elapsed_seconds"), (int, float)):
                elapsed = float(row["time/elapsed_seconds"])
            if row.get("eval") and isinstance(row.get("eval/episode_return"), (int, float)):
                evals.append([int(row.get("env_steps", 0)), round(float(row["eval/episode_return"]), 4),
                              round(elapsed, 2)])
    rates = sorted(rates[1:] or rates)  # the first iteration's rate includes compilation
    return {"env_steps": steps, "steps_per_s": round(rates[len(rates) // 2], 1) if rates else None,
            "evals": evals}


def git_commit() -> tuple[str, bool]:
    """``git rev-parse HEAD`` and whether the library or the command line it
    runs differs from it (``nnx_ppo/``, ``pyproject.toml``, ``bench/suite*.py``;
    the results this script appends do not count)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "nnx_ppo",
                                     "pyproject.toml", "bench/suite.py", "bench/suite_envs.py"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return commit, dirty


def read_rows(out: Path) -> list[dict]:
    """The rows of the results file (none if it does not exist); a torn last line is ignored."""
    if not out.exists():
        return []
    rows = []
    for line in out.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _key(row: dict) -> tuple[str, str, int, str]:
    return row["task"], row["network"], int(row["seed"]), row["label"]


class Interrupted(Exception):
    """A run was stopped by Ctrl-C (or SIGTERM): nothing is recorded for it."""


def _run(command: list[str], log) -> tuple[int, str, float]:
    """Run ``command`` (its output appended to ``log``); return code, stdout, wall seconds.
    Ctrl-C reaches the child too (same process group): it stops cleanly; we wait for it."""
    t0 = time.perf_counter()
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stdout, _ = proc.communicate()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            stdout, _ = proc.communicate(timeout=120)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            stdout, _ = proc.communicate()
        log.write((stdout or "") + "(interrupted)\n")
        log.flush()
        raise Interrupted() from None
    log.write(stdout)
    log.flush()
    return proc.returncode, stdout, time.perf_counter() - t0


def run_one(task: Task, network: str, seed: int, label: str, extra_args: list[str], log) -> dict:
    """Train and evaluate one (task, network, seed) and return its row."""
    directory = run_dir(label, task, network, seed)
    if directory.exists():  # left by an interrupted run: start it again
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    commit, dirty = git_commit()
    train = train_command(task, network, seed, directory, extra_args)
    row = {"task": task.name, "network": network, "seed": seed, "label": label, "kind": task.kind,
           "env": task.env, "env_kwargs": task.env_kwargs, "extra_args": extra_args, "budget": task.budget,
           "threshold": task.threshold, "random": task.random, "best": task.best,
           "command": shlex.join(train), "commit": commit, "dirty": dirty, "run_dir": _rel(directory),
           "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    rc, stdout, wall = _run(train, log)
    if rc == 130:
        raise Interrupted()
    row.update(wall_s=round(wall, 1), **_trained(directory))
    if rc != 0:
        return {**row, "failed": f"train exited {rc}: {stdout.strip().splitlines()[-1] if stdout.strip() else ''}",
                "solved": False}
    evaluate = eval_command(task, directory)
    rc, stdout, eval_wall = _run(evaluate, log)
    if rc == 130:
        raise Interrupted()
    row.update(eval_command=shlex.join(evaluate), eval_wall_s=round(eval_wall, 1), episodes=EPISODES)
    try:
        if rc != 0:
            raise ValueError(f"eval exited {rc}")
        row.update(parse_eval(stdout))
    except ValueError as e:
        return {**row, "failed": str(e).splitlines()[0], "solved": False}
    row["solved"] = row["eval_mean"] >= task.threshold
    row["normalized"] = round(task.normalize(row["eval_mean"]), 4)
    return row


def schedule(tasks: list[Task], networks: list[str] | None, seeds: list[int]) -> list[tuple[Task, str, int]]:
    """The runs in order: seed outermost, so one seed of every (task, network) comes first."""
    return [(task, network, seed) for seed in seeds for task in tasks for network in task.networks
            if networks is None or network in networks]


def cmd_run(args) -> int:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    extra_args = shlex.split(args.extra_args or "")
    tasks = [TASK_BY_NAME[name] for name in args.tasks]
    if args.budget is not None:
        tasks = [dataclasses.replace(t, budget=args.budget) for t in tasks]
    missing = [t.name for t in tasks if t.launcher == "suite_envs" and importlib.util.find_spec("xminigrid") is None]
    if missing:
        print(f"skipping {', '.join(missing)}: xminigrid is not installed (pip install \"nnx_ppo[bench]\")")
        tasks = [t for t in tasks if t.name not in missing]
    runs = schedule(tasks, args.networks, args.seeds)
    if args.dry_run:
        for task, network, seed in runs:
            print(shlex.join(train_command(task, network, seed, run_dir(args.label, task, network, seed), extra_args)))
        return 0
    def stop(signum, frame):  # `kill PID` stops like Ctrl-C: the run in progress ends cleanly, unrecorded
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    log_path = out.with_name(out.stem + "_runs.log")
    done_before = {_key(r) for r in read_rows(out)}
    todo = sum((t.name, n, s, args.label) not in done_before for t, n, s in runs)
    print(f"{len(runs)} runs (label {args.label!r}), {todo} to do; results: {_rel(out)}; "
          f"their output: {_rel(log_path)}", flush=True)
    with log_path.open("a") as log:
        for i, (task, network, seed) in enumerate(runs, 1):
            done = {_key(r): r for r in read_rows(out)}  # read each time: another runner may have added rows
            key = (task.name, network, seed, args.label)
            if key in done:
                if done[key].get("extra_args", []) != extra_args:
                    print(f"warning: {key} is in {out} with other --extra-args ({done[key].get('extra_args')}); "
                          f"skipped", flush=True)
                continue
            print(f"[{i}/{len(runs)}] {task.name} {network} seed {seed} ({task.budget:,} steps) ...", end=" ",
                  flush=True)
            try:
                row = run_one(task, network, seed, args.label, extra_args, log)
            except (Interrupted, KeyboardInterrupt):
                print("interrupted: not recorded", flush=True)
                return 130
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if "failed" in row:
                print(f"FAILED ({row['failed']})", flush=True)
            else:
                print(f"return {row['eval_mean']:.3f} ± {row['eval_std']:.3f}  "
                      f"{'solved' if row['solved'] else 'not solved'}  {row['wall_s']:.0f} s", flush=True)
    return 0


def cmd_list(args) -> int:
    print(f"{'task':<24} {'kind':<7} {'networks':<9} {'budget':>10} {'thr':>8} {'random':>8} {'best':>8} "
          f"{'steps/s':>8}  env [kwargs]")
    for t in TASKS:
        kwargs = f" {json.dumps(t.env_kwargs)}" if t.env_kwargs else ""
        print(f"{t.name:<24} {t.kind:<7} {','.join(t.networks):<9} {t.budget:>10,} {t.threshold:>8g} "
              f"{t.random:>8g} {t.best:>8g} {t.steps_per_s:>8,.0f}  {t.env}{kwargs}")
    if args.verbose:
        for t in TASKS:
            print(f"\n{t.name}: {t.why}")
    return 0


def random_score(task: Task, episodes: int = 1024, max_steps: int = 2500, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of the return of uniformly random actions
    over ``episodes`` episodes of ``task``'s env (each up to ``max_steps``)."""
    import jax
    import jax.numpy as jnp

    from nnx_ppo.envs import make
    from nnx_ppo.envs.spaces import sample

    sys.path.insert(0, str(HERE))
    __import__("suite_envs").register()  # the xminigrid: source
    env = make(task.env, **task.env_kwargs)

    @jax.jit
    def returns(key):
        reset_key, act_key = jax.random.split(key)
        states = jax.vmap(env.reset)(jax.random.split(reset_key, episodes))

        def step(carry, key):
            states, total, alive = carry
            actions = jax.vmap(lambda k: sample(env.action_space, k))(jax.random.split(key, episodes))
            states = jax.vmap(env.step)(states, actions)
            total = total + alive * states.reward
            alive = alive * (1.0 - states.done)
            return (states, total, alive), None

        init = (states, jnp.zeros(episodes), jnp.ones(episodes))
        (_, total, alive), _ = jax.lax.scan(step, init, jax.random.split(act_key, max_steps))
        return total, alive

    total, alive = returns(jax.random.key(seed))
    if float(alive.max()) > 0:
        print(f"warning: {task.name}: {int(alive.sum())} episodes still running after {max_steps} steps")
    return float(total.mean()), float(total.std())


def cmd_random(args) -> int:
    for name in args.tasks:
        t0 = time.perf_counter()
        task = TASK_BY_NAME[name]
        mean, std = random_score(task, args.episodes, args.max_steps)
        print(f"{name:<24} random return {mean:10.3f} ± {std:8.3f}  ({args.episodes} episodes, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


# ----------------------------------------------------------------------------- statistics


def median(values) -> float:
    """The median (numpy's)."""
    import numpy as np

    return float(np.median(np.asarray(values, float)))


def _score(row: dict) -> float:
    """A row's normalized score: a failed run counts as a random policy's (0)."""
    return 0.0 if "failed" in row else float(row["normalized"])


def summarize(rows: list[dict]) -> dict:
    """Aggregate statistics of one label's rows (all tasks and networks)."""
    import numpy as np

    from nnx_ppo._app.plot import bootstrap_interval, interquartile_mean

    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["network"]), []).append(r)
    scores = [[_score(r) for r in g] for g in groups.values()]
    flat = [s for g in scores for s in g]
    pairs_solved = sum(2 * sum(r["solved"] for r in g) > len(g) for g in groups.values())
    return {"runs": len(rows), "pairs": len(groups), "pairs_solved": pairs_solved,
            "runs_solved": sum(r["solved"] for r in rows), "failed": sum("failed" in r for r in rows),
            "median": median(flat), "median_ci": bootstrap_interval(scores, np.median, groups=True),
            "iqm": interquartile_mean(flat), "iqm_ci": bootstrap_interval(scores, interquartile_mean, groups=True)}


# ----------------------------------------------------------------------------- report


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def _task_order() -> dict[tuple[str, str], int]:
    return {(t.name, n): i for i, (t, n, _) in enumerate(schedule(list(TASKS), None, [0]))}


def report_markdown(rows: list[dict], labels: list[str], plot: Path | None) -> str:
    """The results section: aggregate table per label, then one table of every (task, network)."""
    from nnx_ppo._app.plot import interquartile_mean

    lines = []
    lines.append("| label | runs | (task, network) solved | runs solved | median normalized [95% CI] | "
                 "IQM normalized [95% CI] | failed |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for label in labels:
        mine = [r for r in rows if r["label"] == label]
        for kind in (None, "memory", "control"):
            sub = [r for r in mine if kind is None or r["kind"] == kind]
            if not sub:
                continue
            s = summarize(sub)
            name = label if kind is None else f"{label}: {kind} only"
            lines.append(f"| {name} | {s['runs']} | {s['pairs_solved']} / {s['pairs']} "
                         f"({s['pairs_solved'] / s['pairs']:.0%}) | {s['runs_solved']} / {s['runs']} | "
                         f"{_fmt(s['median'])} [{_fmt(s['median_ci'][0])}, {_fmt(s['median_ci'][1])}] | "
                         f"{_fmt(s['iqm'])} [{_fmt(s['iqm_ci'][0])}, {_fmt(s['iqm_ci'][1])}] | {s['failed']} |")
    lines.append("")
    head = "| task | network | threshold | " + " | ".join(
        f"{label}: final mean (median over seeds) | solved | normalized IQM" for label in labels) + " |"
    lines.append(head)
    lines.append("| --- | --- | --- | " + " | ".join("--- | --- | ---" for _ in labels) + " |")
    order = _task_order()
    for (task_name, network) in sorted(order, key=order.get):
        cells = []
        any_rows = False
        for label in labels:
            group = [r for r in rows if r["label"] == label and r["task"] == task_name and r["network"] == network]
            if not group:
                cells.append("- | - | -")
                continue
            any_rows = True
            ok = [r for r in group if "failed" not in r]
            mean = _fmt(median([r["eval_mean"] for r in ok]), 3) if ok else "failed"
            cells.append(f"{mean} | {sum(r['solved'] for r in group)} / {len(group)} | "
                         f"{_fmt(interquartile_mean([_score(r) for r in group]))}")
        if any_rows:
            lines.append(f"| {task_name} | {network} | {TASK_BY_NAME[task_name].threshold:g} | "
                         + " | ".join(cells) + " |")
    if plot is not None:
        lines += ["", f"![normalized scores per task and label]({plot.relative_to(HERE).as_posix()})"]
    return "\n".join(lines)


def paired(rows: list[dict], labels: list[str]) -> list[dict]:
    """The rows of ``labels`` whose (task, network, seed) every label has run,
    so that candidates are compared on the same runs."""
    runs = [{(r["task"], r["network"], r["seed"]) for r in rows if r["label"] == label} for label in labels]
    common = set.intersection(*runs) if runs else set()
    return [r for r in rows if r["label"] in labels and (r["task"], r["network"], r["seed"]) in common]


def choice_markdown(rows: list[dict], labels: list[str], baseline: str) -> str:
    """How the defaults are chosen over the suite (issue 35, point 3), on the
    runs every label has made:

    * per label, (task, network) pairs solved (a majority of seeds at the
      threshold) by network, and the mean normalized score;
    * leave-one-out: for each pair held out, the label with the best mean
      normalized score over the *other* pairs is chosen, and its score on the
      held-out pair is what the choice gets there. The sum over pairs of
      those held-out scores is set beside ``baseline``'s (the defaults before).
    """
    import numpy as np

    rows = paired(rows, labels)
    if baseline not in labels or not rows:
        return ""
    pairs = sorted({(r["task"], r["network"]) for r in rows}, key=_task_order().get)
    groups = {(label, pair): [r for r in rows if r["label"] == label and (r["task"], r["network"]) == pair]
              for label in labels for pair in pairs}
    score = {key: float(np.mean([_score(r) for r in group])) for key, group in groups.items()}
    solved = {key: 2 * sum(r["solved"] for r in group) > len(group) for key, group in groups.items()}
    lines = [f"Compared on the runs every label has made: {len(rows) // len(labels)} runs per label over "
             f"{len(pairs)} (task, network) pairs.", "",
             "| label | memory pairs solved, lstm | memory pairs solved, gru | control pairs solved | "
             "mean normalized |", "| --- | --- | --- | --- | --- |"]
    def count(label, kind, network=None):
        """``(solved, total)`` pairs of ``kind`` (and ``network``) for ``label``."""
        mine = [p for p in pairs if TASK_BY_NAME[p[0]].kind == kind and network in (None, p[1])]
        return f"{sum(solved[label, p] for p in mine)} / {len(mine)}"

    for label in labels:
        mean = np.mean([score[label, p] for p in pairs])
        lines.append(f"| {label} | {count(label, 'memory', 'lstm')} | {count(label, 'memory', 'gru')} | "
                     f"{count(label, 'control')} | {_fmt(mean)} |")
    held, base, picks = [], [], []
    for out in pairs:
        rest = [p for p in pairs if p != out]
        pick = max(labels, key=lambda label: (np.mean([score[label, p] for p in rest]), label == baseline))
        picks.append(pick)
        held.append(score[pick, out])
        base.append(score[baseline, out])
    counts = ", ".join(f"{label} {picks.count(label)}" for label in labels)
    lines += ["", f"Leave-one-out: each pair's label chosen on the other {len(pairs) - 1} pairs ({counts} times); "
              f"mean normalized score on the held-out pairs {_fmt(float(np.mean(held)))}, against "
              f"{_fmt(float(np.mean(base)))} for `{baseline}` (the defaults before)."]
    return "\n".join(lines)


def plot_scores(rows: list[dict], labels: list[str], path: Path) -> None:
    """Left: every run's normalized score per (task, network), the median as a bar, one colour per label.
    Right: the aggregate IQM per label with its bootstrap 95% interval (all, memory, control)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    order = _task_order()
    pairs = [p for p in sorted(order, key=order.get) if any((r["task"], r["network"]) == p for r in rows)]
    fig, (ax, agg) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.8 / max(1, len(labels))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, label in enumerate(labels):
        color = colors[j % len(colors)]
        for i, pair in enumerate(pairs):
            scores = [_score(r) for r in rows if r["label"] == label and (r["task"], r["network"]) == pair]
            if not scores:
                continue
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, np.median(scores), width * 0.9, color=color, alpha=0.35, label=label if i == 0 else None)
            ax.scatter(np.full(len(scores), x), scores, s=10, color=color, zorder=3)
        for k, kind in enumerate(("all", "memory", "control")):
            sub = [r for r in rows if r["label"] == label and (kind == "all" or r["kind"] == kind)]
            if not sub:
                continue
            s = summarize(sub)
            x = k - 0.4 + width * (j + 0.5)
            agg.errorbar(x, s["iqm"], yerr=[[s["iqm"] - s["iqm_ci"][0]], [s["iqm_ci"][1] - s["iqm"]]],
                         fmt="o", color=color, capsize=3)
    for i, (task_name, _) in enumerate(pairs):  # the threshold on the normalized scale
        level = TASK_BY_NAME[task_name].normalize(TASK_BY_NAME[task_name].threshold)
        ax.plot([i - 0.45, i + 0.45], [level, level], color="black", linewidth=1.2,
                label="threshold" if i == 0 else None)
    agg.set_xlim(-0.6, 2.6)
    for axis in (ax, agg):
        axis.axhline(0.0, color="gray", linewidth=0.6)
        axis.axhline(1.0, color="gray", linewidth=0.6, linestyle="--")
    ax.set_xticks(range(len(pairs)), [f"{t}\n{n}" for t, n in pairs], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("normalized final return (random 0, best 1)")
    ax.set_title(f"final policy, {EPISODES} episodes; dots: seeds, bars: median")
    ax.legend(fontsize=8)
    agg.set_xticks(range(3), ["all", "memory", "control"])
    agg.set_title("IQM, 95% CI")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rewrite_readme(section: str, readme: Path = README) -> None:
    """Put ``section`` between the suite markers of bench/README.md (appended with them if absent)."""
    text = readme.read_text()
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)


def cmd_report(args) -> int:
    rows = [r for r in read_rows(Path(args.out)) if r["task"] in TASK_BY_NAME]
    labels = args.labels or list(dict.fromkeys(r["label"] for r in rows))
    rows = [r for r in rows if r["label"] in labels]
    if not rows:
        print(f"no rows in {args.out} (for labels {labels})")
        return 1
    plot = Path(args.plot)
    plot_scores(rows, labels, plot)
    commits = sorted({r["commit"][:10] + ("+dirty" if r.get("dirty") else "") for r in rows})
    dates = sorted(r["started"][:10] for r in rows)
    header = (f"Rows: {len(rows)} runs in `{_rel(Path(args.out))}`, {dates[0]} to {dates[-1]}, "
              f"commit(s) {', '.join(commits)}. "
              f"`python bench/suite.py report` rewrote this part.\n")
    section = header + "\n" + report_markdown(rows, labels, plot if plot.is_relative_to(HERE) else None)
    if args.baseline and len(labels) > 1:
        section += "\n\n" + choice_markdown(rows, labels, args.baseline)
    print(section)
    if not args.no_readme:
        rewrite_readme(section)
        print(f"\nwrote {plot} and the section of {README}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="the tasks, their budgets and thresholds")
    p_list.add_argument("--verbose", "-v", action="store_true", help="also where each threshold comes from")
    p_run = sub.add_parser("run", help="train and evaluate the runs not yet in --out")
    p_run.add_argument("--tasks", nargs="+", default=[t.name for t in TASKS], choices=list(TASK_BY_NAME))
    p_run.add_argument("--networks", nargs="+", default=None, choices=["mlp", "lstm", "gru"],
                       help="only these of each task's networks (default: all of them)")
    p_run.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p_run.add_argument("--label", default="defaults", help="names the candidate defaults (default: defaults)")
    p_run.add_argument("--extra-args", default="", help="flags appended to every train command, one string")
    p_run.add_argument("--out", default=str(OUT))
    p_run.add_argument("--dry-run", action="store_true", help="print the train commands and exit")
    p_run.add_argument("--budget", type=int, default=None,
                       help="train every task for this many env steps instead of its budget (smoke tests: "
                            "give such rows their own --out and --label)")
    p_random = sub.add_parser("random", help="measure the random policy's return of tasks")
    p_random.add_argument("--tasks", nargs="+", default=[t.name for t in TASKS], choices=list(TASK_BY_NAME))
    p_random.add_argument("--episodes", type=int, default=1024)
    p_random.add_argument("--max-steps", type=int, default=1000)
    p_report = sub.add_parser("report", help="tables, plot, and the README section")
    p_report.add_argument("--out", default=str(OUT))
    p_report.add_argument("--labels", nargs="+", default=None, help="default: every label, in order of appearance")
    p_report.add_argument("--plot", default=str(PLOT))
    p_report.add_argument("--no-readme", action="store_true", help="print only; leave bench/README.md as it is")
    p_report.add_argument("--baseline", default=None,
                          help="the label of the defaults before: adds the comparison of the labels on their "
                               "common runs and the leave-one-out choice among them")
    args = parser.parse_args(argv)
    return {"list": cmd_list, "run": cmd_run, "random": cmd_random, "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
