"""README.md and docs/ are part of the product: their links resolve and their commands parse.

A newcomer follows the README alone, so it stays short, every relative link in it and in
docs/ leads to a file and heading that exist, each docs page says up front what it is for,
and every ``steadytune`` command the README shows is one the CLI accepts as written.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from steadytune.cli.main import build_parser, parse

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")
SUMMARY = ("> **What:**", "> **For:**", "> **Start with:**")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `# comment` in a bash block is not a heading."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def code_blocks(text: str) -> list[str]:
    """The bodies of the fenced code blocks, with shell line continuations joined."""
    blocks, body, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            if fenced:
                blocks.append("\n".join(body).replace("\\\n", " "))
                body = []
            fenced = not fenced
        elif fenced:
            body.append(line)
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation gone, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers a repeated heading
    return out


def relative_links(page: Path) -> list[str]:
    links = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                links.append(target)
    return links


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no file {dest.relative_to(REPO) if REPO in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading with the anchor #{anchor} in {dest.name}")
    return problems


def shown_commands(text: str) -> list[list[str]]:
    """Every ``steadytune ...`` command in the code blocks, as argv after the program name."""
    commands = []
    for block in code_blocks(text):
        for line in block.splitlines():
            if line.startswith("$ "):
                line = line[2:]
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue  # not shell (a transcript's output)
            command: list[str] = []
            for word in [*words, ";"]:
                if word.endswith(";") and word != ";":  # `steadytune hold j4; steadytune release j4`
                    command.append(word[:-1])
                    word = ";"
                if word not in {"&&", "&", ";", "|", "||"}:
                    command.append(word)
                    continue
                # A synopsis (`dashboard [RUNS_DIR] [--port 7860]`) shows the options, not a command.
                if command[:1] == ["steadytune"] and not any(w.startswith("[") for w in command):
                    commands.append(command[1:])
                command = []
    return commands


def test_the_readme_reads_in_ten_minutes() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_each_docs_page_opens_with_what_it_covers_who_it_is_for_and_where_to_start(page: Path) -> None:
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == "", f"{page.name}: a title, then a blank line"
    opening = [*lines[2:5], "", "", ""][:3]
    assert all(line.startswith(mark) for line, mark in zip(opening, SUMMARY, strict=True)), (
        f"{page.name}: lines 3-5 should be the {' / '.join(SUMMARY)} summary"
    )


def test_the_readme_shows_the_commands_that_get_a_newcomer_going() -> None:
    shown = {tuple(argv[:1]) for argv in shown_commands(README.read_text())}
    for word in ("demo", "dashboard", "validate", "check", "run", "supervise", "server", "submit", "queue"):
        assert (word,) in shown, f"the README's code blocks no longer show `steadytune {word}`"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_shown_parses_as_written(page: Path) -> None:
    commands = shown_commands(page.read_text())
    refused = []
    for argv in commands:
        try:
            parse(argv)
        except SystemExit as refusal:
            refused.append(f"steadytune {shlex.join(argv)} (exit {refusal.code})")
    assert refused == []


def test_the_readme_names_every_command_and_only_real_ones() -> None:
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    known = set(sub.choices)
    text = README.read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    in_table = {
        span.strip("`").split()[0]
        for row in table.splitlines()
        if row.startswith("| `")
        for span in CODE_SPAN.findall(row.split(" | ")[0])
    }
    assert in_table == known, f"missing from the table: {known - in_table}; not commands: {in_table - known}"


def known_commands() -> set[str]:
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    return set(sub.choices)


def unknown_commands(text: str, known: set[str]) -> set[str]:
    """The ``steadytune WORD`` a page's inline code names whose WORD is no subcommand (the commands
    in code blocks are parsed whole by the test above)."""
    named = {m.group(1) for m in re.finditer(r"`steadytune ([a-z][a-z-]*)", text)}
    return named - known


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_page_names_only_real_commands(page: Path) -> None:
    assert unknown_commands(page.read_text(), known_commands()) == set()


def test_a_page_naming_a_command_that_does_not_exist_is_caught() -> None:
    text = "Send it `steadytune control pause`, or `steadytune pause RUN`; steadytune does the rest."
    assert unknown_commands(text, known_commands()) == {"control"}


def test_the_link_checker_sees_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# There\n\n## A `code` heading: yes\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-code-heading-yes) [gone](missing.md) [bad](there.md#not-a-heading)\n"
        "[web](https://example.com/x) `[code](nowhere.md)`\n"
    )
    assert [p.split(":")[0] for p in broken_links(page)] == ["missing.md", "there.md#not-a-heading"]


def test_alerts_page_documents_every_field_of_the_generic_webhook_body() -> None:
    """The table under "The generic webhook's body" lists exactly the fields that are sent."""
    from steadytune.alerts.message import generic_payload, test_alert

    page = (REPO / "docs" / "alerts.md").read_text()
    section = page.split("### The generic webhook's body", 1)[1].split("\n#", 1)[0]
    documented = set(re.findall(r"^\| `([\w.]+)` \|", section, re.M))
    body = generic_payload(test_alert("r1"))
    sent = {k for k in body if k != "alert"} | {f"alert.{k}" for k in body["alert"]}
    assert documented == sent
