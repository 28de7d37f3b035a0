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
