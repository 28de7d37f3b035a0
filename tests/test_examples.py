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


# In the slow run only (the default suite keeps under 15 minutes): what these
# two show is tested on its own, seed batches into run directories and their
# plot by tests/algorithms/test_seeds.py, tests/test_python_run_dir.py and
# tests/test_plot.py, export by tests/test_policy.py.
SLOW = {"seeds_and_plot", "export_policy"}


@pytest.mark.parametrize("script", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                    for p in SCRIPTS], ids=[p.stem for p in SCRIPTS])
def test_example_runs(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "--tiny"])
    runpy.run_path(str(script), run_name="__main__")
