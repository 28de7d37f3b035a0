"""The Python examples in README.md and docs/*.md run as written.

Each file's ```python blocks run in order in one namespace (later blocks may
use names from earlier ones), in a temporary working directory.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _blocks(path):
    return BLOCK.findall(path.read_text())


@pytest.mark.parametrize("path", [p for p in DOCS if _blocks(p)], ids=lambda p: p.name)
def test_doc_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc_{path.stem}"}
    for i, code in enumerate(_blocks(path)):
        if code.lstrip().startswith("# sketch"):
            continue
        try:
            exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as err:  # report which block failed
            raise AssertionError(f"{path.name}, python block {i} failed: {err!r}\n{code}") from err
