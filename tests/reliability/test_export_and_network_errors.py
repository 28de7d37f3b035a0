"""Issue 34, "Every failure is one line": a network function that returns no
network, a damaged exported policy, an export into a directory in use; and
an export that needs no example observation and serves any batch size.

The CLI cases check one line on stderr, no traceback and exit 2; the Python
ones a named exception with a one-line message. The run they export is a
tiny MLP (8 envs, one iteration, no evaluation)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nnx_ppo import cli

TINY = ["--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "1", "--ppo.rollout-length", "8",
        "--ppo.n-epochs", "1", "--ppo.total-steps", "64", "--eval.no-enabled", "--quiet"]

NOT_NETWORKS = textwrap.dedent('''
    from flax import nnx

    from nnx_ppo.networks.feedforward import Dense


    def make_dict(env, rngs):
        return {"policy": None}


    def make_linear(env, rngs):
        return nnx.Linear(env.observation_space.shape[0], 2, rngs=rngs)


    def make_dense(env, rngs):
        return Dense(env.observation_space.shape[0], 2, rngs)
''')


def one_line(err: str) -> str:
    """``err``, checked to be one ``nnx-ppo: error:`` line without a traceback."""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("nnx-ppo: error: "), err
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A trained run of a tiny MLP, with its final checkpoint."""
    run = tmp_path_factory.mktemp("export") / "run"
    assert cli.main(["train", "cue_memory", "--network", "mlp", *TINY, "--run-dir", str(run)]) == 0
    return run


def _env():
    import nnx_ppo

    return nnx_ppo.make("cue_memory")


def _mlp():
    """An untrained tiny MLP for cue_memory."""
    from flax import nnx

    import nnx_ppo

    return nnx_ppo.make_actor_critic_for_env(_env(), "mlp", nnx.Rngs(0), actor_hidden_sizes=[8],
                                             critic_hidden_sizes=[8])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """An exported policy (an untrained MLP: what is read back is the point),
    exported from an example observation batch."""
    from nnx_ppo.policy import Policy

    obs = np.zeros((1, *_env().observation_space.shape), np.float32)
    return Policy(_mlp()).export(tmp_path_factory.mktemp("exported") / "policy", obs)


# ----------------------------------------------------------------------------- 1. a network function


@pytest.fixture
def not_networks(tmp_path) -> Path:
    path = tmp_path / "not_networks.py"
    path.write_text(NOT_NETWORKS)
    return path


@pytest.mark.parametrize("function, returned", [
    ("make_dict", "returned a dict;"),
    ("make_linear", "returned a Linear, which has no initialize_state or reset_state;"),
    ("make_dense", "returned a Dense whose output is a float32[1, 2] array, not a PPONetworkOutput;"),
])
def test_a_network_function_that_returns_no_network_is_one_line(function, returned, not_networks, tmp_path, capsys):
    """It was a 27-line traceback ending in "no attribute initialize_state",
    after the run directory was written."""
    run = tmp_path / "run"
    assert cli.main(["train", "cue_memory", "--network", f"{not_networks}:{function}", *TINY,
                     "--run-dir", str(run)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{not_networks}:{function} {returned}" in err and "docs/own_network.md" in err, err
    assert not run.exists()


def test_train_ppo_names_a_network_function_that_returns_no_network(not_networks):
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.network_spec import NetworkFunctionError

    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=1, total_steps=64),
                         eval=EvalConfig(enabled=False))
    for function in ("make_dict", "make_linear"):
        with pytest.raises(NetworkFunctionError, match=f"{function} returned an? (dict|Linear)") as caught:
            train_ppo("cue_memory", f"{not_networks}:{function}", config)
        assert isinstance(caught.value, TypeError) and len(str(caught.value).splitlines()) == 1


# ----------------------------------------------------------------------------- 2. a damaged export


@pytest.mark.parametrize("name, what", [("step.jax", "a jax.export artifact"),
                                        ("initial_carry.jax", "a jax.export artifact"),
                                        ("params.npz", "a NumPy .npz archive"),
                                        ("policy.json", "an exported policy's policy.json")])
def test_a_truncated_export_file_is_named_in_one_line(name, what, exported, tmp_path):
    """A truncated step.jax said "unpack_from requires a buffer of at least
    ... bytes" without naming the file."""
    from nnx_ppo.policy import ExportedPolicyError, load_exported

    damaged = Path(shutil.copytree(exported, tmp_path / "policy"))
    data = (damaged / name).read_bytes()
    (damaged / name).write_bytes(data[:len(data) // 2])
    with pytest.raises(ExportedPolicyError) as caught:
        load_exported(damaged)
    message = str(caught.value)
    assert f"{damaged / name} is truncated or not {what}" in message and len(message.splitlines()) == 1, message
    (damaged / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"{name}( is)? missing"):
        load_exported(damaged)


def test_an_export_of_an_earlier_unreleased_version_is_refused_in_one_line(exported, tmp_path):
    """Format 1 (an earlier, unreleased version: one batch size, an
    initial_carry without ``done``) is not read: one line says so."""
    import json

    from nnx_ppo.policy import ExportedPolicyError, load_exported

    old = Path(shutil.copytree(exported, tmp_path / "policy"))
    info = json.loads((old / "policy.json").read_text())
    (old / "policy.json").write_text(json.dumps({**info, "format": "nnx-ppo exported policy 1"}))
    with pytest.raises(ExportedPolicyError) as caught:
        load_exported(old)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and str(old / "policy.json") in message, message
    assert "written by an earlier, unreleased version of nnx-ppo and cannot be read" in message, message


# ----------------------------------------------------------------------------- 3. an export directory in use


def test_export_refuses_a_directory_in_use_and_overwrites_only_an_export(run, tmp_path, capsys):
    """`nnx-ppo export --out DIR` wrote into a non-empty DIR, replacing and
    mixing files silently. Now: anything in DIR is refused (exit 2, one
    line); --overwrite replaces a previous export and says what it replaced,
    and never touches other files."""
    from nnx_ppo.policy import load_exported

    out = tmp_path / "policy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for flags in ([], ["--overwrite"]):
        assert cli.main(["export", str(run), "--out", str(out), *flags]) == 2
        err = one_line(capsys.readouterr().err)
        assert "notes.txt" in err, err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # nothing written or removed

    out = tmp_path / "second"
    assert cli.main(["export", str(run), "--out", str(out)]) == 0
    assert "for any batch size" in capsys.readouterr().out
    before = (out / "step.jax").stat().st_mtime_ns
    assert cli.main(["export", str(run), "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "already holds an exported policy" in err and "--overwrite" in err, err
    assert (out / "step.jax").stat().st_mtime_ns == before
    assert cli.main(["export", str(run), "--out", str(out), "--overwrite", "--batch-size", "3"]) == 0
    printed = capsys.readouterr().out
    assert "replaced the previous export's initial_carry.jax, params.npz, policy.json, step.jax" in printed, printed
    assert load_exported(out).batch_size == 3


def test_python_export_refuses_a_directory_in_use(exported, tmp_path):
    from nnx_ppo.policy import ExportDirInUseError, Policy, load_exported

    policy = Policy(_mlp(), env=_env())
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ExportDirInUseError, match="notes.txt"):
            policy.export(busy, overwrite=overwrite)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    previous = Path(shutil.copytree(exported, tmp_path / "previous"))
    with pytest.raises(ExportDirInUseError, match=r"already holds an exported policy .*pass overwrite=True"):
        policy.export(previous, batch_size=2)
    assert load_exported(previous).batch_size == 1  # untouched
    policy.export(previous, batch_size=2, overwrite=True)
    assert load_exported(previous).batch_size == 2


# ----------------------------------------------------------------------------- 5. export without an example


def test_a_loaded_policy_exports_without_an_example_for_any_batch_size(run, tmp_path):
    """load_policy knows the run's env: export needs no observation, and the
    one artifact acts as the policy at batch 1 and at batch 5."""
    import jax

    from nnx_ppo.policy import load_exported, load_policy

    policy = load_policy(run)
    exported = load_exported(policy.export(tmp_path / "policy"))
    assert exported.any_batch_size
    shape = policy.observation_spec().shape  # the run's env, rebuilt from its checkpoint
    for n in (1, 5):
        obs = jax.random.normal(jax.random.key(n), (4, n, *shape))
        done = np.zeros((4, n), bool)
        done[2, -1] = True
        carry, exported_carry = policy.initial_carry(n), exported.initial_carry(n)
        for t in range(4):
            action, carry = policy(carry, obs[t], done[t])
            exported_action, exported_carry = exported.step(exported_carry, obs[t], done[t])
            np.testing.assert_array_equal(np.asarray(exported_action), np.asarray(action))
