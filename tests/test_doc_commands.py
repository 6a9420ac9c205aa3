"""Every command line the documentation gives is one the code takes: each `python -m envab.<module>`
and `python bench/<script>.py` in README.md and docs/**/*.md is asked for its `--help` (with its
subcommand, where it names one), and every `--flag` the page types after it must be there. A
renamed or removed flag fails here, not in a reader's terminal."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from test_docs import REPO, code_texts, markdown_files

COMMAND = re.compile(r"(?:-m\s+(envab(?:\.\w+)+)|(bench/\w+\.py))([^\n`]*)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# Flags that belong to another program on the same line (after a `--` or a pipe), or that a
# page shows as something a command refuses.
NOT_THEIRS = re.compile(r"\s(?:--\s|\|)")


def commands(page: Path) -> list[tuple[str, str | None, list[str]]]:
    """(module or script, its first bare word, the flags typed after it) for each command."""
    found = []
    for code in code_texts(page):
        joined = re.sub(r"\\\n\s*", " ", code)  # a command continued over lines
        for module, script, rest in COMMAND.findall(joined):
            rest = NOT_THEIRS.split(rest, maxsplit=1)[0]
            words = rest.split()
            first = words[0] if words and re.fullmatch(r"[a-z][a-z_-]*", words[0]) else None
            found.append((module or script, first, sorted(set(FLAG.findall(rest)))))
    return found


@cache
def help_text(program: str, first: str | None) -> str:
    """The program's --help, with its subcommand's where `first` names one it takes."""
    base = (
        [sys.executable, "-m", program]
        if program.startswith("envab")
        else [
            sys.executable,
            str(REPO / program),
        ]
    )
    if first is not None:
        sub = subprocess.run(
            [*base, first, "--help"], capture_output=True, text=True, cwd=REPO, timeout=300
        )
        if sub.returncode == 0:
            return sub.stdout
    out = subprocess.run([*base, "--help"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, f"{program} --help: {out.stderr[-1000:]}"
    return out.stdout


PAGES = [p for p in markdown_files() if commands(p)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_flag_a_page_types_is_one_the_command_takes(page):
    unknown = []
    for program, first, flags in commands(page):
        text = help_text(program, first)
        unknown += [f"{program} {flag}" for flag in flags if flag not in FLAG.findall(text)]
    assert unknown == []


def test_a_renamed_flag_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("    python -m envab.verify receipts/x --no-such-flag\n")
    ((program, first, flags),) = commands(page)
    assert (program, flags) == ("envab.verify", ["--no-such-flag"])
    assert "--no-such-flag" not in FLAG.findall(help_text(program, first))
