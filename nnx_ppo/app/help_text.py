"""The command line's help as shown: tyro's text without docstring markup
(:func:`clean_help`) and ``train --help``'s flags in titled sections
(:func:`group_options`, :data:`TRAIN_FLAG_GROUPS`)."""

from __future__ import annotations

import re

from nnx_ppo.app.commands import TrainCommand, flag_groups

__all__ = ["clean_help", "group_options", "TRAIN_FLAG_GROUPS"]


_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj):`(~?)([\w.]+)`")


def _plain(text: str) -> str:
    """Sphinx roles and double backquotes of docstrings as plain text."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return text.replace("``", "")


def clean_help(text: str) -> str:
    """``text`` (tyro's help) without docstring markup; in a boxed line the
    right border stays where it was."""
    lines = []
    for line in text.splitlines(keepends=True):
        plain = _plain(line)
        body, end = plain.rstrip("\n"), plain[len(plain.rstrip("\n")):]
        if plain != line and body.endswith("│"):
            body = body[:-1] + " " * (len(line.rstrip("\n")) - len(body)) + "│"
        lines.append(body + end)
    return "".join(lines)


TRAIN_FLAG_GROUPS = flag_groups(TrainCommand)
"""How ``train --help`` splits tyro's one box of top-level flags (the
training and evaluation hyperparameters keep their own ``ppo`` and ``eval``
boxes): each field declares its section (``group`` in its metadata)."""


def group_options(text: str, groups: dict[str, tuple[str, ...]]) -> str:
    """Split the ``options`` section of tyro's help into titled sections, one
    per group, in the order given; a flag in no group stays under ``options``."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines[:-1]) if line.strip() == "options"
                  and set(lines[i + 1].strip()) == {"-"}), None)
    if start is None:
        return text
    end = next((i for i in range(start + 2, len(lines)) if not lines[i].strip()), len(lines))
    entries: list[list[str]] = []
    for line in lines[start + 2:end]:
        if line.startswith("  -") or not entries:
            entries.append([line])
        else:
            entries[-1].append(line)
    group_of = {flag: title for title, flags in groups.items() for flag in flags}
    sections: dict[str, list[str]] = {"options": [], **{title: [] for title in groups}}
    for entry in entries:
        flag = entry[0].split()[0].rstrip(",")
        sections[group_of.get(flag, "options")].extend(entry)
    header, rule = lines[start], lines[start + 1]
    width = len(header.rstrip("\n"))
    out = []
    for title, body in sections.items():
        if body:
            out += [f" {title}".ljust(width) + "\n", rule, *body, " " * width + "\n"]
    return "".join(lines[:start] + out[:-1] + lines[end:])
