"""Env sources (``PREFIX:NAME`` specs): one table in the registry, ``register_source`` for third parties."""

import pytest

import nnx_ppo.envs as envs
from nnx_ppo import cli
from nnx_ppo.envs import CueMemory, Discrete, TimeLimit, make, register_source, registry


def _toy_factory(name, *, n_cues=2, episode_length=None):
    """``toy:cue`` is CueMemory; ``toy:cue`` with ``episode_length`` adds a TimeLimit. It takes no
    ``random_initial_steps`` / ``random_reset_steps``: ``make`` must not pass them on."""
    if name != "cue":
        raise ValueError(f"toy has no {name!r}; it has: cue")
    env = CueMemory(n_cues=n_cues, delay=3)
    return env if episode_length is None else TimeLimit(env, episode_length)


@pytest.fixture
def toy():
    """The ``toy`` source, registered for one test; the table is restored afterwards."""
    before = dict(registry._SOURCES)
    register_source("toy", _toy_factory, description="a toy source for the tests", example="toy:cue")
    yield registry._SOURCES["toy"]
    registry._SOURCES.clear()
    registry._SOURCES.update(before)


def test_builtin_sources_are_in_the_table():
    assert [s.prefix for s in registry.list_sources()][:3] == ["gymnax", "playground", "brax"]
    assert all(s.description and s.examples for s in registry.list_sources())
    assert "register_source" in envs.__all__ and envs.register_source is register_source


def test_make_builds_from_a_registered_source(toy):
    env = make("toy:cue", n_cues=3)
    assert isinstance(env, CueMemory) and isinstance(env.action_space, Discrete) and env.action_space.n == 3
    with pytest.raises(ValueError, match="toy has no 'nope'"):
        make("toy:nope")
    assert "toy:cue" in envs.list_envs()
    assert toy.prefix == "toy" and toy.examples == ("toy:cue",)


def test_time_limit_options_are_set_on_the_sources_time_limit(toy):
    env = make("toy:cue", episode_length=10, random_initial_steps=True, random_reset_steps=4)
    assert isinstance(env, TimeLimit) and isinstance(env.env, CueMemory)
    assert (env.max_steps, env.random_initial_steps, env.random_reset_steps) == (10, True, 4)
    plain = make("toy:cue", episode_length=10)
    assert (plain.random_initial_steps, plain.random_reset_steps) == (False, 0)
    # without a time limit there is nothing to set them on (as for the built-in cue_memory)
    assert isinstance(make("toy:cue", random_initial_steps=True), CueMemory)


def test_unknown_prefix_lists_the_known_ones(toy):
    with pytest.raises(ValueError, match="'nope:cue'.*gymnax:, playground:, brax:, toy:"):
        make("nope:cue")
    with pytest.raises(ValueError, match="'toy:'"):
        make("toy:")


def test_registration_errors_name_the_argument(toy):
    with pytest.raises(ValueError, match="prefix 'toy' is already registered"):
        register_source("toy", _toy_factory)
    with pytest.raises(ValueError, match="prefix 'gymnax' is already registered"):
        register_source("gymnax", _toy_factory)
    with pytest.raises(ValueError, match="prefix must not contain ':'.*'toy2:'"):
        register_source("toy2:", _toy_factory)
    with pytest.raises(ValueError, match="prefix must be a non-empty string"):
        register_source("", _toy_factory)
    with pytest.raises(ValueError, match="factory must be callable"):
        register_source("toy2", "not a factory")
    with pytest.raises(ValueError, match="example must be a spec 'toy2:NAME', got 'cue'"):
        register_source("toy2", _toy_factory, example="cue")
    assert "toy2" not in {s.prefix for s in registry.list_sources()}


def test_unregister_source(toy):
    assert registry.unregister_source("toy") is toy
    with pytest.raises(ValueError, match="Unknown environment spec 'toy:cue'"):
        make("toy:cue")
    with pytest.raises(KeyError, match="no env source 'toy'"):
        registry.unregister_source("toy")
    register_source("toy", _toy_factory)  # the prefix is free again
    assert registry.list_sources()[-1].examples == ()


def test_the_cli_lists_a_registered_source(toy, capsys):
    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[:1] == ["toy:"] and "a toy source for the tests" in line for line in out.splitlines())
    assert "toy:cue" in out.split()
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "toy:NAME" in capsys.readouterr().out
