"""The docs hold together: README.md and docs/*.md link only to what exists, quote only
commands the CLI has, and the README stays a short guide.

- every relative link `[text](path)` or `[text](path#anchor)` names an existing file, and an
  anchor names a heading of the target (GitHub's slugs);
- every `xhagent ...` quoted in backticks or on a line of a fenced block walks the click
  command tree word by word to a command whose `--help` answers with exit 0 (words in
  capitals, with `<>`, `[`, `=`, `/`, `.` or a leading `-` are arguments or options and end
  the walk; `a|b` names alternatives, each walked);
- README.md has at most README_MAX_LINES lines.

Each check has a control case that shows it fails on a made-up mistake. No root, no network.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import click
from click.testing import CliRunner

from xhagent.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 320

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
# `xhagent ...`, `$ xhagent ...`, `.venv/bin/xhagent ...`, `XHAGENT_SOCKET=P xhagent ...`
COMMAND = re.compile(
    r"^(?:\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:sudo\s+)?(?:\S*/bin/)?xhagent(?:\s+(.*))?$"
)
SUBCOMMAND_WORD = re.compile(r"[a-z][a-z0-9-]*(?:\|[a-z][a-z0-9-]*)*")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(paragraphs of prose, lines of fenced code blocks)."""
    prose, code, paragraph = [], [], []
    fence = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            else:
                code.append(line)
            continue
        if m:
            fence = m.group(1)
        if m or not line.strip():
            if paragraph:
                prose.append("\n".join(paragraph))
            paragraph = []
            continue
        paragraph.append(line)
    if paragraph:
        prose.append("\n".join(paragraph))
    return prose, code


# -- links ---------------------------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped,
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if in_fence is not None:
            if m and m.group(1)[0] == in_fence[0]:
                in_fence = None
            continue
        if m:
            in_fence = m.group(1)
            continue
        h = HEADING.match(line)
        if h:
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """The link targets of the prose, outside code spans and code blocks."""
    prose, _ = split_markdown(text)
    out = []
    for paragraph in prose:
        out += LINK.findall(CODE_SPAN.sub(" ", paragraph))
    return out


def broken_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in links(text):
        if not target or SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.name}: ({target})"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest}")
        elif anchor:
            if dest.is_dir() or dest.suffix != ".md":
                problems.append(f"{where}: an anchor into {dest.name}, which is not markdown")
            elif anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}: no heading #{anchor} in {dest.name}")
    return problems


# -- commands ------------------------------------------------------------------------------------
def quoted_commands(text: str) -> list[str]:
    """What follows `xhagent` in each command quoted in backticks or in a fenced block."""
    prose, code = split_markdown(text)
    candidates = list(code)
    for paragraph in prose:
        candidates += [span for _, span in CODE_SPAN.findall(paragraph)]
    out = []
    for candidate in candidates:
        m = COMMAND.match(" ".join(candidate.replace("\\|", "|").split()))  # `a\|b` in tables
        if m:
            out.append((m.group(1) or "").split(" #")[0].strip())
    return out


@functools.cache
def help_answer(path: tuple[str, ...]) -> tuple[int, str]:
    res = CliRunner().invoke(main, [*path, "--help"])
    return res.exit_code, res.output


@functools.cache
def subcommand(path: tuple[str, ...], name: str) -> click.Command | None:
    cmd: click.Command = main
    ctx = click.Context(main, info_name="xhagent")
    for word in (*path, name):
        assert isinstance(cmd, click.Group)
        cmd = cmd.get_command(ctx, word)
        if cmd is None:
            return None
        ctx = click.Context(cmd, info_name=word, parent=ctx)
    return cmd


def command_problems(rest: str) -> list[str]:
    """Why `xhagent REST` is not a command the CLI has; [] when it is."""
    problems: list[str] = []

    def visit(cmd: click.Command, path: tuple[str, ...], words: list[str]) -> None:
        if isinstance(cmd, click.Group) and words and SUBCOMMAND_WORD.fullmatch(words[0]):
            for name in words[0].split("|"):
                sub = subcommand(path, name)
                if sub is None:
                    problems.append(f"xhagent {' '.join((*path, name))}: no such command")
                else:
                    visit(sub, (*path, name), words[1:])
            return
        code, output = help_answer(path)
        if code != 0:
            problems.append(f"xhagent {' '.join(path)} --help: exit {code}: {output[-300:]}")

    visit(main, (), rest.split())
    return problems


def missing_commands(text: str) -> list[str]:
    return [p for rest in quoted_commands(text) for p in command_problems(rest)]


def readme_too_long(text: str) -> bool:
    return len(text.splitlines()) > README_MAX_LINES


# -- the checks ----------------------------------------------------------------------------------
def test_there_are_docs():
    assert README.exists()
    assert len(pages()) > 3, pages()


def test_relative_links_resolve():
    assert [p for page in pages() for p in broken_links(page)] == []


def test_quoted_commands_exist():
    found = {page.name: quoted_commands(page.read_text(encoding="utf-8")) for page in pages()}
    assert sum(map(len, found.values())) > 30, found  # the extraction sees them
    problems = [
        f"{name}: {problem}"
        for name, commands in found.items()
        for rest in commands
        for problem in command_problems(rest)
    ]
    assert problems == []


def test_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move reference to docs/"


# -- controls: each check fails on a made-up mistake ---------------------------------------------
def test_control_a_broken_link_is_reported(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading: `xhagent run`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "a.md"
    page.write_text(
        "# A\n\n"
        "[fine](b.md) and [fine too](b.md#real-heading-xhagent-run) and [again](b.md#twice-1)\n"
        "and [here](#a) and [out](https://example.com/x.md)\n\n"
        "[gone](missing.md), [no such heading](b.md#nope), [nor here](#nowhere)\n\n"
        "`[in code](missing-too.md)`\n\n"
        "```\n[in a block](missing-as-well.md)\n```\n"
    )
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert "missing.md" in problems[0]
    assert "#nope" in problems[1]
    assert "#nowhere" in problems[2]


def test_control_a_made_up_command_is_reported():
    text = (
        "Run `xhagent frobnicate --now`, then `xhagent submit FILE` and `xhagent bench io`.\n\n"
        "| `xhagent trace stats\\|frob FILE` | a table cell escapes its bar |\n\n"
        "```sh\n"
        "$ xhagent cgroup frobnicate GROUP\n"
        "xhagent cgroup freeze|thaw|kill GROUP   # alternatives, each a command\n"
        "XHAGENT_SOCKET=/tmp/a.sock .venv/bin/xhagent ps --all\n"
        "xhagent trace view t.xht    # http://127.0.0.1:PORT/\n"
        "```\n"
    )
    assert sorted(quoted_commands(text)) == [
        "bench io",
        "cgroup freeze|thaw|kill GROUP",
        "cgroup frobnicate GROUP",
        "frobnicate --now",
        "ps --all",
        "submit FILE",
        "trace stats|frob FILE",
        "trace view t.xht",
    ]
    assert sorted(missing_commands(text)) == [
        "xhagent cgroup frobnicate: no such command",
        "xhagent frobnicate: no such command",
        "xhagent trace frob: no such command",
    ]


def test_control_an_overlong_readme_is_reported():
    assert readme_too_long("line\n" * (README_MAX_LINES + 1))
    assert not readme_too_long("line\n" * README_MAX_LINES)


def test_slugs_follow_github():
    assert (
        slug("The agent: `xhagent run` and its clients") == "the-agent-xhagent-run-and-its-clients"
    )
    assert slug("Task stuck Pending") == "task-stuck-pending"
    assert slug("I/O engine: `xhagent.io`") == "io-engine-xhagentio"
    assert slug("[Links](x.md) and sizes (bytes)") == "links-and-sizes-bytes"
