"""The Python examples in README.md and docs/*.md run as written.

Every ```python block runs on its own, in a fresh namespace and a temporary
working directory, so each one must carry its own imports and setup. A block
whose first line is `# sketch` is shown, not run; one that includes a script
of examples/ (`--8<-- "examples/NAME.py"`) is run by tests/test_examples.py.
Test ids name the file and the block's position among the file's ```python
blocks, counting from 1 (`networks.md[3]` is the third); tracebacks point at
the line in the file.
Pages under docs/api/ hold mkdocstrings directives, not Python, and are not
collected.
"""

import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# An opening fence (possibly indented, e.g. inside a list item) up to the
# closing fence at the same indentation.
BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)


def _blocks(path):
    """(1-based number, first code line, code) for each ```python block."""
    text = path.read_text()
    blocks = []
    for number, match in enumerate(BLOCK.finditer(text), start=1):
        first_line = text.count("\n", 0, match.start(2)) + 1
        blocks.append((number, first_line, textwrap.dedent(match.group(2))))
    return blocks


def _cases():
    for path in DOCS:
        for number, first_line, code in _blocks(path):
            if code.lstrip().startswith(("# sketch", "--8<--")):
                continue
            yield pytest.param(path, first_line, code, id=f"{path.name}[{number}]")


@pytest.mark.parametrize("path, first_line, code", list(_cases()))
def test_doc_block_runs(path, first_line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc_{path.stem}"}
    # Leading newlines make line numbers in tracebacks those of the file.
    source = "\n" * (first_line - 1) + code
    exec(compile(source, str(path.relative_to(ROOT)), "exec"), namespace)
