"""A Griffe extension for the docs site: Sphinx roles in docstrings as code.

The docstrings use Sphinx cross-reference roles (``:class:`Foo```,
``:func:`~pkg.mod.f```), which Markdown would show literally. This turns each
into inline code (only the last component for a ``~`` target) and a reST
literal-block marker ``text::`` at a line end into ``text:``. mkdocs.yml loads
it (``extensions`` of the python handler); it is not part of the site.
"""

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
LITERAL_MARKER = re.compile(r"(\S)::$", re.M)


def _as_code(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring once, when Griffe loads the object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(_as_code, obj.docstring.value)
            obj.docstring.value = LITERAL_MARKER.sub(r"\1:", text)
