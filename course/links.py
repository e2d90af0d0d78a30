"""Links that hold: every relative link, anchor and cited file of a set of Markdown pages exists,
and no page cites an issue by its number (a reader of the repository, or of the student release,
has no way to resolve one).

A cited file is a path in a code span or a code block (`reports/performance.md`, a config in a
command) that ends in a file type the project uses and starts with a folder the page's folder or
the root holds: `reports/NAME.md` (a placeholder: a word in capitals), `results/ID.json` or
`xavier/exercises.py` (what a command writes, an example) are not files to find. Anchors follow
GitHub's rule: a heading's text, lowercased, punctuation dropped, spaces as hyphens, a repeated
one numbered ``-1``, ``-2``.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*?\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
PATH = re.compile(r"(?<![\w./$-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|yml|jsonl|json|txt|sh|png|gz|toml|csv|log))"
                  r"(?![\w/])")
ISSUE = re.compile(r"\bissues?[ \t]*#?[0-9]+", re.I)
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b|seedS\b|\{")  # reports/NAME.md, RUN_DIR/, _seed{0,1,2}


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered, lowercased, punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def markdown_files(root: Path) -> list[Path]:
    """The pages of a folder: git's files (tracked, or new and not ignored) in a checkout, else every .md."""
    if (root / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                                cwd=root, capture_output=True, text=True, check=True).stdout.split()
        return sorted(root / name for name in listed if (root / name).is_file())
    return sorted(p for p in root.rglob("*.md") if ".venv" not in p.parts)


@functools.cache
def ignored(path: Path, root: Path) -> bool:
    """True for a path git ignores in the checkout ``root`` (False outside a checkout)."""
    if not (root / ".git").exists():
        return False
    return subprocess.run(["git", "check-ignore", "-q", str(path.resolve())], cwd=root).returncode == 0


def blank(match: re.Match) -> str:
    """What ``match`` covered, as spaces: hidden from the next search, its lines kept in place."""
    return re.sub(r"[^\n]", " ", match.group(0))


def problems(page: Path, root: Path) -> list[str]:
    """What is broken on ``page``: each as 'page:line: what'."""
    text = page.read_text()
    where = page.relative_to(root)
    out = []

    def line(index: int) -> int:
        return text.count("\n", 0, index) + 1

    for match in ISSUE.finditer(text):
        out.append(f"{where}:{line(match.start())}: cites {match.group(0)!r}, which no reader can resolve")
    prose = FENCE.sub(blank, text)  # no code blocks
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{where}:{line(match.start())}: links to {path}, which does not exist")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            out.append(f"{where}:{line(match.start())}: links to #{anchor} of {file.relative_to(root)}, "
                       "no such heading")
    unlinked = LINK.sub(blank, prose)  # a link's text is not a citation
    cited = [(m.start(), m.group(1)) for m in CODE_SPAN.finditer(unlinked)]
    cited += [(m.start(), m.group(0)) for m in FENCE.finditer(text)]
    for start, code in cited:
        for ref in PATH.findall(code):
            # Only folders the project holds: a run's output folder (runs/, git-ignored) exists on one
            # machine and not on a fresh clone, and its files are made by the commands the page gives.
            bases = [base for base in (page.parent, root)
                     if (base / ref.split("/")[0]).is_dir() and not ignored(base / ref.split("/")[0], root)]
            if bases and not PLACEHOLDER.search(ref) and not any((base / ref).exists() for base in bases):
                out.append(f"{where}:{line(start)}: cites {ref}, which does not exist")
    return out


def check(root: Path) -> list[str]:
    """Every problem of every Markdown page under ``root``."""
    return [problem for page in markdown_files(root) for problem in problems(page, root)]
