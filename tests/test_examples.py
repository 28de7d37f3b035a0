"""Every script in examples/ runs, at a tiny size (``--tiny``), in a fresh
working directory."""

import pathlib
import runpy
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if p.name != "leaky_net.py")  # leaky_net.py: a module


def test_every_example_is_listed_in_the_examples_readme():
    listed = (EXAMPLES / "README.md").read_text()
    assert SCRIPTS and all(f"]({p.name})" in listed for p in [*SCRIPTS, EXAMPLES / "leaky_net.py"])


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "--tiny"])
    runpy.run_path(str(script), run_name="__main__")
