"""The docs' other checks: links (external ones well-formed, the README's inside the repository), and
backticked repository paths, `prefill.` names and inline commands that still exist."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

from docs_blocks import ROOT, shown, strip_code
from docs_runner import Runner, check_command

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
BARE_URL = re.compile(r"(?<![(\[\"'`])\bhttps?://[^\s)>\]`\"']+")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(src|tests|benchmarks|docs|scripts)/[\w./-]+$")
DOTTED = re.compile(r"^prefill(\.[A-Za-z_]\w*)+$")
INLINE_COMMAND = re.compile(r"^(prefill [a-z]+|make [a-z-]+$)[^|<>`]*$")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(path: Path) -> set[str]:
    text = strip_code(path.read_text())
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def check_links(path: Path) -> list[str]:
    """External links well-formed; in the README, relative links name a file of the repository (and heading)."""
    problems, rel, text = [], shown(path), strip_code(path.read_text())
    for target in [m.group(1) for m in LINK.finditer(text)] + BARE_URL.findall(text):
        if target.startswith(("http://", "https://")):
            url = urlparse(target)
            if not url.netloc or " " in target or not re.match(r"^[\w.-]+(:\d+)?$", url.netloc):
                problems.append(f"{rel}: malformed URL {target!r}")
        elif target.startswith("mailto:"):
            continue
        elif path.name == "README.md":  # the docs' own links are mkdocs --strict's to check
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists() or ROOT not in dest.parents and dest != ROOT:
                problems.append(f"{rel}: link {target!r} points to no file of the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel}: link {target!r}: no heading #{anchor} in {file or rel}")
    return problems


def check_names(path: Path, runner: Runner) -> list[str]:
    """Backticked repository paths and `prefill.x.y` names must exist (they go stale when code moves), and an
    inline `prefill COMMAND --option` or `make TARGET` must name a command and options that exist."""
    problems, rel = [], shown(path)
    for span in CODE_SPAN.findall(strip_code(path.read_text())):
        span = span.strip()
        if INLINE_COMMAND.match(span):
            problems += check_command(span, rel, runner)
        elif REPO_PATH.match(span) and not any(ch in span for ch in "*<>") and "..." not in span:
            if not (ROOT / span.rstrip("/")).exists():
                problems.append(f"{rel}: `{span}` does not exist")
        elif DOTTED.match(span) and not resolves(span):
            problems.append(f"{rel}: `{span}` names no module or definition under src/")
    return problems


def resolves(dotted: str) -> bool:
    """`prefill.engine.loop.StepLoop.add`: the longest module prefix is a file, and each rest name is defined."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            source = module.read_text()
            return all(
                re.search(
                    rf"^\s*(?:async\s+)?(def|class)\s+{n}\b|^\s*{n}\s*[:=]|\b{n}\b.*import|import.*\b{n}\b",
                    source,
                    re.M,
                )
                for n in parts[cut:]
            )
    return False
