"""Every command line the documentation gives is one the code takes: each `python -m envab.<module>`
and `python bench/<script>.py` in README.md and docs/**/*.md is asked for its `--help` (with its
subcommand, where it names one), and every `--flag` the page types after it must be there; each
`snakemake ...` a page types is planned (a dry run) on a fresh copy of the workflow. A renamed or
removed flag, profile, config file or target fails here, not in a reader's terminal."""

from __future__ import annotations

import re
import shutil
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


# --- each `snakemake` command the docs type, as a dry run ------------------------------------

SNAKEMAKE = re.compile(r"(?:^|\s|/)snakemake((?:\s+[^\s#&|;]+)*)")
# What a dry run cannot show, with why: the conda deployment needs conda (documented as untested),
# a lock removal and the lint plan nothing (the lint has tests/test_workflow_lint.py), and a
# report needs a finished run's outputs (the `report` rule runs it after the answer).
NOT_DRY_RUN = {
    "--sdm": "needs conda",
    "--unlock": "plans nothing",
    "--lint": "plans nothing",
    "--report": "reports a finished run",
}


def snakemake_commands() -> dict[str, list[str]]:
    """Each distinct `snakemake ...` argument list a page of the docs (not the dated results,
    which record what ran then) types in code, with the pages that type it."""
    found: dict[str, list[str]] = {}
    for page in markdown_files():
        if "results" in page.relative_to(REPO).parts:
            continue
        for code in code_texts(page):
            joined = re.sub(r"\\\n\s*", " ", code)
            for line in joined.splitlines():
                for args in SNAKEMAKE.findall(line.split(" #")[0]):
                    if "..." in args or "<" in args:  # a placeholder a page names, not a command
                        continue
                    key = " ".join(args.split())
                    found.setdefault(key, []).append(str(page.relative_to(REPO)))
    return found


COMMANDS = snakemake_commands()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The workflow as a fresh clone has it: no run's outputs."""
    from conftest import copy_workflow

    root = copy_workflow(tmp_path_factory.mktemp("docs-dry-run"))
    for name in (".test", "profiles", "config"):
        shutil.copytree(
            REPO / name,
            root / name,
            ignore=lambda _d, names: (
                {"results", "receipts", "logs", "benchmarks", ".snakemake"} & set(names)
            ),
        )
    return root


# Configs whose task source is OSWorld's own evaluation_examples, which a user unpacks beside the
# workflow: planned with the set from ../shared/osworld/ (skipped, saying so, where it is absent).
NEEDS_OSWORLD = ("config/rehearsal-osworld.yaml",)


@pytest.mark.parametrize("args", sorted(COMMANDS), ids=lambda a: a or "(none)")
def test_each_snakemake_command_the_docs_type_plans_on_a_fresh_clone(checkout, args, request):
    words = args.split()
    skipped = [why for flag, why in NOT_DRY_RUN.items() if flag in words]
    if skipped:
        pytest.skip(f"{args}: {skipped[0]}")
    if any(name in words for name in NEEDS_OSWORLD):
        examples = request.getfixturevalue("osworld_examples")  # skips, saying why, if absent
        if not (checkout / "evaluation_examples").exists():
            (checkout / "evaluation_examples").symlink_to(examples)
        oracles = checkout / "tests" / "fixtures" / "osworld-oracles.jsonl"
        oracles.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / "tests" / "fixtures" / "osworld-oracles.jsonl", oracles)
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", *words, "--dry-run", "--quiet", "rules"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{COMMANDS[args]}: snakemake {args}\n{done.stderr[-3000:]}"
