"""The light entry points import no JAX: ``import nnx_ppo.runner``,
``nnx-ppo --help`` (and each command's ``--help``) and ``nnx-ppo envs``.

Each check runs in a fresh interpreter, since this test process has long
since imported JAX. JAX alone takes about 2 s to import on this project's
2-core machine; without it ``nnx-ppo --help`` takes about 0.25 s.
"""

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

HEAVY = ("jax", "flax", "optax", "orbax")
MARK = "HEAVY-MODULES:"


def _heavy_modules_after(code: str) -> list[str]:
    """The top-level heavy packages in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = (
        "import contextlib, io, json, sys\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + f"print({MARK!r} + json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith(MARK))
    return json.loads(line[len(MARK):])


def _cli(*argv: str) -> str:
    return (
        "from nnx_ppo import cli\n"
        "try:\n"
        f"    code = cli.main({list(argv)!r})\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "assert code in (0, None), code\n"
    )


@pytest.mark.parametrize("code", [
    pytest.param("import nnx_ppo.runner", id="import-runner"),
    pytest.param("import nnx_ppo.presets, nnx_ppo.algorithms.config", id="import-presets-config"),
    pytest.param("import nnx_ppo.envs\nassert 'cue_memory' in nnx_ppo.envs.list_envs()", id="list_envs"),
    pytest.param(_cli("--help"), id="help"),
    pytest.param(_cli("train", "--help"), id="train-help"),
    pytest.param(_cli("eval", "--help"), id="eval-help"),
    pytest.param(_cli("distill", "--help"), id="distill-help"),
    pytest.param(_cli("envs"), id="envs"),
])
def test_imports_no_jax(code):
    assert _heavy_modules_after(code) == []


def test_the_probe_sees_a_heavy_module():
    """The check above would catch one (a stand-in for ``optax.tree``: importing JAX for real takes 2 s)."""
    assert _heavy_modules_after("import types\nsys.modules['optax.tree'] = types.ModuleType('optax.tree')") == ["optax"]


def test_help_is_quick():
    # Measured 0.21-0.26 s on this project's 2-core machine (2.4-3.9 s while
    # it imported JAX); the bound leaves room for a slow or busy machine.
    script = pathlib.Path(sys.executable).parent / "nnx-ppo"
    command = [str(script), "--help"] if script.exists() else [sys.executable, "-m", "nnx_ppo.cli", "--help"]
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        best = min(best, time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr
        assert "usage: nnx-ppo" in proc.stdout
    assert best < 3.0, f"nnx-ppo --help took {best:.2f} s"


def test_help_piped_into_a_reader_that_stops_ends_quietly():
    """``nnx-ppo train --help | head -1``: the reader closes the pipe early;
    the command exits 0 without a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from nnx_ppo import cli; sys.exit(cli.main())",
                             "train", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader stops; the rest of the help hits a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_help_is_plain_and_flags_are_clean(capsys):
    """No docstring markup or tyro artefacts in the help; one flag for
    --no-preset; --seeds names its default."""
    from nnx_ppo import cli

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    for artefact in ("``", ":func:", ":class:", "--no-no-preset", "(default: )", "__tyro"):
        assert artefact not in text, artefact
    assert "--print-config" in text and "(default: one run, of --seed)" in " ".join(text.split())


def test_train_help_groups_its_flags(capsys):
    """train --help has a titled box per group of flags (tyro's: a nested
    dataclass of the command each): --seeds and the config's own fields stay
    under "options" (a new flag of the command must be given a group), then
    env and network, run directory and logging, multi-process, ppo and eval."""
    from nnx_ppo import cli
    from nnx_ppo._app.commands import ProcessFlags, RunFlags, SetupFlags
    from nnx_ppo.algorithms.config import TrainConfig, flat_fields

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    titles = [line.strip() for line, rule in zip(text.splitlines(), text.splitlines()[1:])
              if not line.startswith("  ") and rule.strip() and set(rule.strip()) == {"-"}]
    assert titles == ["positional arguments", "options", "env and network options",
                      "run directory and logging options", "multi-process options", "ppo options", "eval options"]

    def flags_under(title: str) -> list[str]:
        section = re.split(r"\n\s*\n", text.split(f"\n {title}")[1])[0]
        return re.findall(r"^  (-h|--[a-z][\w.-]*)", section, re.M)

    own = [f"--{name.replace('_', '-')}" for name in flat_fields(TrainConfig) if "." not in name]
    assert flags_under("options") == ["-h", "--seeds", *own]
    for title, group in (("env and network", SetupFlags), ("run directory and logging", RunFlags),
                         ("multi-process", ProcessFlags)):
        assert flags_under(f"{title} options") == [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(group)]


def test_unknown_abbreviated_flag_gets_a_suggestion(capsys):
    from nnx_ppo import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--ppo.lr", "3"])
    assert exit_.value.code == 2
    assert "nnx-ppo: did you mean --ppo.learning-rate?" in capsys.readouterr().err


def test_print_config_shows_the_preset_with_the_flags_given(capsys):
    import json

    from nnx_ppo import cli

    assert cli.main(["train", "gymnax:CartPole-v1", "--ppo.n-envs", "16", "--print-config"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["preset"] == "gymnax:CartPole-v1 (mlp)" and settings["network"] == "mlp"
    assert settings["config"]["ppo"]["n_envs"] == 16 and settings["config"]["ppo"]["rollout_length"] == 128
    assert cli.main(["train", "--print-config", "--no-preset"]) == 0  # the default network, an LSTM
    settings = json.loads(capsys.readouterr().out)
    assert settings["preset"] == "library defaults (lstm)" and settings["network_kwargs"] == {"forget_bias": 3.0}
    assert cli.main(["train", "--print-config", "--no-preset", "--network", "gru", "--ppo.n-envs", "32"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["preset"] == "library defaults (gru)" and settings["network_kwargs"] == {"update_bias": 3.0}
    assert settings["config"]["ppo"]["n_envs"] == 32 and settings["config"]["ppo"]["rollout_length"] == 128


def test_docs_cli_lists_every_subcommand(capsys):
    """docs/cli.md's table of subcommands is the parser's."""
    import re
    from pathlib import Path

    from nnx_ppo import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    parser = set(re.search(r"\{([\w,]+)\}", capsys.readouterr().out).group(1).split(","))
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    table = set(re.findall(r"^\| `nnx-ppo (\w+)", doc, re.M))
    assert table == parser, (table, parser)
    for name in parser:
        assert f"## `nnx-ppo {name}`" in doc, name


def test_progress_without_a_terminal_is_lines_at_a_bounded_rate(capsys):
    """Piped (pytest captures stderr: no terminal), tqdm draws its bar as
    whole lines, at most one per interval: the first and the last, with the
    step count (the messages stay on stdout)."""
    from nnx_ppo.runner import Progress

    progress = Progress(total_steps=1000, quiet=False, interval=3600.0)
    progress.start()
    for step in range(10, 1001, 10):
        progress.iteration({}, step)
    progress.close()
    shown = capsys.readouterr()
    lines = shown.out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("compiling") and lines[1].startswith("compiled in")
    bar = [line.strip() for line in shown.err.splitlines() if line.strip()]
    assert len(bar) == 2, bar  # the bar as it started and as it ended, nothing in between
    assert "10.0/1.00k" in bar[0] and "100%" in bar[1] and "1.00k/1.00k" in bar[1], bar


def test_train_help_shows_the_defaults_of_the_envs_preset(capsys):
    """`train ENV --help` shows the preset's settings as the defaults (what
    the run would start from), the library's without a preset."""
    from nnx_ppo import cli

    def n_envs_default(argv):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = " ".join(capsys.readouterr().out.split())
        return text.split("--ppo.n-envs INT")[1].split("(default: ")[1].split(")")[0]

    assert n_envs_default(["train", "gymnax:CartPole-v1", "--help"]) == "8"  # the CartPole preset
    assert n_envs_default(["train", "--help"]) == "64"  # cue_memory's preset, the default env
    assert n_envs_default(["train", "gymnax:CartPole-v1", "--no-preset", "--help"]) == "64"  # the CLI defaults


def test_docs_cli_default_settings_are_the_parsers(capsys):
    """docs/cli.md's table of the default agent's settings is what
    `nnx-ppo train --print-config` gives."""
    from nnx_ppo import cli

    assert cli.main(["train", "--print-config"]) == 0
    settings = json.loads(capsys.readouterr().out)
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    table = doc.split("The default settings are:")[1].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        flags, values = [cell.strip() for cell in line.strip("|").split("|")]
        for flag, value in zip(re.findall(r"`--([\w.-]+)`", flags), values.split(" / ")):
            rows[flag] = float(re.match(r"[\d,.e-]+", value.strip().strip("`")).group(0).replace(",", ""))
    assert len(rows) == 9, rows
    for flag, value in rows.items():
        *sections, name = flag.replace("-", "_").split(".")
        where = settings["config"]
        for section in sections:
            where = where[section]
        assert float(where[name]) == value, flag
    network = table.splitlines()[2]
    assert f"`{settings['network']}`, hidden size {settings['hidden_size']}" in network
