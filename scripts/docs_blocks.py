"""The docs' example blocks: the marker comment, the fenced block under it, its `$ ` commands and outputs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!--\s*example(?::\s*(?P<flags>[^>]*?))?\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)")
FLAGS = {"varies", "slow", "serve", "long"}


@dataclass
class Example:
    """One marked block: where it is, its flags and the (command, output) pairs it shows."""

    path: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    fence: str
    info: str
    flags: set[str]
    exit_code: int
    columns: int | None = None  # the terminal width the commands see, when not COLUMNS
    steps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def shown(path: Path) -> str:
    """A path as messages print it: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def docs_files() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "examples" not in p.parts)]


def parse_flags(text: str | None) -> tuple[set[str], int, int | None]:
    """`varies slow exit=2 columns=160` -> ({'varies', 'slow'}, 2, 160); unknown words are an error."""
    flags, code, columns = set(), 0, None
    for word in (text or "").split():
        if word.startswith("exit="):
            code = int(word[5:])
        elif word.startswith("columns="):
            columns = int(word[8:])
        elif word in FLAGS:
            flags.add(word)
        else:
            raise ValueError(f"unknown example flag {word!r} (known: {', '.join(sorted(FLAGS))}, exit=N, columns=N)")
    return flags, code, columns


def split_steps(body: list[str], long: bool) -> list[tuple[str, str]]:
    """A block's lines as (command, output): `$ ` starts a command (a trailing backslash continues it)."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(body)
    for line in lines:
        stripped = line.strip()
        is_command = line.startswith("$ ") or (long and stripped and not stripped.startswith("#"))
        if not is_command:
            if steps:
                steps[-1][1].append(line)
            continue
        command = line[2:] if line.startswith("$ ") else line
        while command.rstrip().endswith("\\"):
            command = command.rstrip()[:-1] + " " + next(lines, "").strip()
        steps.append((command.strip(), []))
    return [(cmd, "\n".join(out).rstrip()) for cmd, out in steps]


def find_examples(path: Path) -> tuple[list[Example], list[str]]:
    """The marked blocks of one file, and the problems found (a marker with no block, a `$ ` block unmarked)."""
    lines = path.read_text().splitlines()
    examples, problems, i = [], [], 0
    rel = shown(path)
    while i < len(lines):
        marker, fence = MARKER.match(lines[i]), FENCE.match(lines[i])
        if marker:
            j = i + 1
            if j >= len(lines) or not FENCE.match(lines[j]):
                problems.append(f"{rel}:{i + 1}: an example marker must sit on the line above a fenced block")
                i += 1
                continue
            flags, code, columns = parse_flags(marker.group("flags"))
            example = read_block(path, lines, j, flags, code)
            example.columns = columns
            examples.append(example)
            i = example.end
        elif fence:
            block = read_block(path, lines, i, set(), 0)
            if any(line.startswith("$ ") for line in lines[i + 1 : block.end - 1]):
                problems.append(f"{rel}:{i + 1}: a `$ ` command block without an <!-- example --> marker above it")
            i = block.end
        else:
            i += 1
    return examples, problems


def read_block(path: Path, lines: list[str], start: int, flags: set[str], code: int) -> Example:
    """The fenced block opening at index `start` (0-based)."""
    fence = FENCE.match(lines[start]).group("fence")
    end = start + 1
    while end < len(lines) and not lines[end].startswith(fence):
        end += 1
    example = Example(path, start + 1, end + 1, fence, lines[start][len(fence) :], flags, code)
    example.steps = split_steps(lines[start + 1 : end], "long" in flags)
    return example


def strip_code(text: str) -> str:
    """The text without fenced blocks (links and headings in them are not links and headings)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and fence is None:
            fence = m.group("fence")
        elif fence and line.startswith(fence):
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)
