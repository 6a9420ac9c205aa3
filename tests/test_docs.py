"""The documentation holds together: every link and every repository path it names resolves, the
README stays a short front door, and it still gives the exact test command CI runs.

What is checked, in README.md and docs/**/*.md:
- every relative link (`[text](path)`, `![alt](path)`) names a file or folder in the repository,
  and a `#anchor` names a heading of the page it points to (GitHub's heading ids);
- every repository path named in code (inline backticks, fenced or indented blocks) exists, e.g.
  `envs/drums/client.py`: a path counts when its first folder is one of the repository's own; paths
  under what runs write (results/, logs/, build/, ...) and templates (`<exp>`, `*`) are outputs,
  not files to find; `python -m envab.<module>` names a module that exists;
- README.md is at most 150 lines and contains, on a line of its own, the command `.ci/run` runs.

Standard library and pytest only, no project imports: this file belongs to the fast tier.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_MAX_LINES = 150

# Top-level folders that runs write into (ignored by git): a path under one names an output.
WRITTEN_BY_RUNS = {"results", "logs", "benchmarks", "build", "receipts", "wandb", ".snakemake"}
# Files the docs name that a run writes beside the sources, with the reason they are not here yet.
WRITTEN_BESIDE_SOURCES = {
    "config/qwen3-vl-4b.manifest.yaml": "written by the GPU deployment's first pin_model job",
}
# `python -m envab.<stage>...`: the installed namespace maps these stages to top-level folders.
STAGE_FOLDERS = {"envs", "trainer", "eval", "analysis"}

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# A module name in full; `envab.<stage>.<job>` and `envab...` are templates, not names.
MODULE = re.compile(r"-m\s+(envab(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?![\w.<])")


def markdown_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code texts): fenced and indented code blocks go to code, the rest is prose
    (whose inline code spans the callers take out themselves)."""
    prose, code = [], []
    fence = None
    previous_blank = True
    in_indented = False
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            else:
                code.append(line)
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        indented = line.startswith(("    ", "\t")) and bool(line.strip())
        if indented and (previous_blank or in_indented):
            in_indented = True
            code.append(line)
            continue
        in_indented = in_indented and not line.strip()
        prose.append(line)
        previous_blank = not line.strip()
    return prose, code


def slug(heading: str) -> str:
    """GitHub's id for a heading: link and code markup dropped, lower case, punctuation removed
    (letters, digits, `_`, `-` and spaces kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = html.unescape(text.replace("`", "")).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = split_markdown(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    ids = set()
    for line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f"{base}-{count}")
    return ids


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """Each relative link of `page` that names nothing, or a heading its target does not have."""
    prose, _ = split_markdown(page.read_text(encoding="utf-8"))
    text = CODE_SPAN.sub("code", "\n".join(prose))  # a bracket in code is not a link
    problems = []
    for target in LINK.findall(text):
        if SCHEME.match(target):
            continue  # http:, https:, mailto: — not this repository's to check
        path, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path)).resolve() if path else page
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading '#{anchor}' in {resolved.name}")
    return problems


def code_texts(page: Path) -> list[str]:
    prose, code = split_markdown(page.read_text(encoding="utf-8"))
    spans = [m.group(2) for m in CODE_SPAN.finditer("\n".join(prose))]
    return spans + code


def named_paths(code: str, root: Path = REPO) -> list[str]:
    """The repository paths a piece of code names: tokens with a slash whose first folder is one
    of the repository's own top-level entries, outputs and templates left out."""
    top = {p.name for p in root.iterdir()} - WRITTEN_BY_RUNS
    paths = []
    for token in code.split():
        token = token.strip("'\"(),;").split("::")[0].rstrip(":.,")
        if "/" not in token or token.startswith(("/", "-")) or "=" in token:
            continue
        if any(c in token for c in "<>{}[]*$|…") or "..." in token:
            continue
        parts = [p for p in token.split("/") if p]
        if parts and parts[0] in top and not WRITTEN_BY_RUNS.intersection(parts):
            paths.append(token.rstrip("/"))
    return paths


def missing_paths(page: Path, root: Path = REPO) -> list[str]:
    missing = []
    for code in code_texts(page):
        for path in named_paths(code, root):
            if not (root / path).exists() and path not in WRITTEN_BESIDE_SOURCES:
                missing.append(path)
        for module in MODULE.findall(code):
            if not module_exists(module, root):
                missing.append(f"python -m {module}")
    return sorted(set(missing))


def module_exists(module: str, root: Path = REPO) -> bool:
    parts = module.split(".")[1:]  # below envab
    base = root / parts[0] if parts and parts[0] in STAGE_FOLDERS else root / "envab"
    rest = parts[1:] if parts and parts[0] in STAGE_FOLDERS else parts
    path = base.joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def ci_test_command() -> str:
    """The one command `.ci/run` runs after its preamble (comments, `set`, `cd`)."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [
        line.strip()
        for line in lines
        if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))
    ]
    assert len(commands) == 1, f".ci/run runs {len(commands)} commands, expected one: {commands}"
    return commands[0]


# -- the repository's documentation -----------------------------------------------------------


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@pytest.mark.parametrize("page", markdown_files(), ids=_name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", markdown_files(), ids=_name)
def test_every_repository_path_named_in_code_exists(page):
    assert missing_paths(page) == []


def test_the_readme_is_a_front_door_of_at_most_150_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_gives_the_exact_test_command_ci_runs():
    command = ci_test_command()
    assert command.startswith("bash setup"), command
    lines = [line.strip() for line in README.read_text(encoding="utf-8").splitlines()]
    assert command in lines, f"README.md lacks the line {command!r}"


def test_the_docs_name_no_machine_paths():
    # The docs speak of the project, wherever it is checked out.
    for page in markdown_files():
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"(?<![\w.])/(work|root|home|tmp)/", text), _name(page)


# -- the checks themselves can fail -----------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "protocol.py").write_text("")
    (tmp_path / "docs" / "b.md").write_text("# B page\n\n## Held out means held out\n")
    return tmp_path


def test_a_broken_link_or_anchor_is_reported(tree):
    page = tree / "docs" / "a.md"
    page.write_text(
        "[ok](b.md) [ok](b.md#held-out-means-held-out) [gone](c.md) [bad](b.md#nowhere)\n"
        "[web](https://example.org/x.md) `[not a link](d.md)`\n\n    [code](e.md)\n"
    )
    assert broken_links(page, tree) == [
        "c.md: no such file",
        "b.md#nowhere: no heading '#nowhere' in b.md",
    ]


def test_a_missing_path_or_module_in_code_is_reported(tree):
    page = tree / "docs" / "a.md"
    page.write_text(
        "`envs/protocol.py: settle` `envs/gone.py` `results/<exp>/x.json` `DIR/y`\n\n"
        "```\npython -m envab.envs.protocol\npython bench/soak.py --out logs/x\n```\n"
    )
    assert missing_paths(page, tree) == ["envs/gone.py"]
    page.write_text("`python -m envab.envs.nothing`\n")
    assert missing_paths(page, tree) == ["python -m envab.envs.nothing"]


def test_github_heading_ids():
    assert slug("The A/B by rule") == "the-ab-by-rule"
    assert slug("results/&lt;exp&gt;/") == "resultsexp"
    assert slug("2026-12-01 — The soak: faults") == "2026-12-01--the-soak-faults"
    assert slug("Arm, backend, `host`") == "arm-backend-host"
