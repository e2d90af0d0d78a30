"""Similarity: pairs of students whose code is alike, and submissions that match the answer key.

Fingerprints are copydetect's (https://github.com/blingenf/copydetect, MIT): the code is
tokenized with Pygments and normalized (names become V/F/O, strings S, comments dropped), then
winnowed (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document
fingerprinting", SIGMOD 2003), the algorithm MOSS uses. A renamed variable or a rewritten
comment does not hide a copy; every k-gram of the starter code (assignment/exercises.py, the
blanks with their docstrings) is boilerplate and left out, so what is compared is what the
students wrote. Runs offline; about 30 ms per file and well under 1 ms per pair.

copydetect hashes k-grams with Python's ``hash()``, which is salted per process, so which
fingerprints winnowing keeps (and a similarity's last digits) would change from run to run.
``report`` therefore compares in a child process with ``PYTHONHASHSEED=0``: the same files give
the same report, and a rerun that grades nobody rewrites identical files.

The similarity of A to B is the fraction of A's fingerprinted tokens also found in B. Pairs are
listed when either direction reaches ``THRESHOLD``; "same code" means the normalized token
streams are equal (a copy up to names, comments and layout). Every student is compared with the
answer key (solutions/exercises.py) too, and a file that is byte-identical to it, or carries its
``### BEGIN SOLUTION`` markers (the student file has none), is named as such.

Files are compared per grading (a group's one file once); ``relabeled`` names each by its
students (their keys in similarity.csv, with their names in similarity.md).

Read this as a list of what to look at, not a verdict: short functions written to one
contract converge, and the corpus's mutants are the key with one edit.

copydetect is in the ``classroom`` extra (the TA's machine), not in the grading image; without
it the gradebook is still written and similarity.md says how to install it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import submission
from .discovery import Student

THRESHOLD = 0.8      # copydetect's report default is 0.33; independently written correct submissions
                     # of this assignment reach ~0.45 against each other and the key (tests/submissions)
NOISE = 25           # copydetect's defaults: k-grams of 25 normalized characters,
GUARANTEE = 30       # every shared run of 30 is found (window 30 - 25 + 1)
KEY = "(answer key)"
MARKER = "### BEGIN SOLUTION"


@dataclass(frozen=True)
class Pair:
    a: str
    b: str              # a student, or KEY
    a_in_b: float       # fraction of a's tokens found in b
    b_in_a: float
    same_code: bool     # equal normalized token streams
    identical: bool     # byte-identical files

    @property
    def score(self) -> float:
        return max(self.a_in_b, self.b_in_a)


@dataclass(frozen=True)
class Similarity:
    pairs: list[Pair]           # student pairs at or over THRESHOLD, most alike first
    key: list[Pair]             # students against the key, at or over THRESHOLD or carrying its markers
    markers: list[str]          # students whose file carries the answer key's solution markers
    compared: int               # students compared
    skipped: list[str]          # students without a readable file
    missing: str = ""           # why nothing was compared (copydetect not installed)


def sources(students: list[Student]) -> tuple[dict[str, str], list[str]]:
    """The text of each student's file (read as the grader reads it), and who has none."""
    texts, skipped = {}, []
    for s in students:
        try:
            texts[s.id] = submission.read(s.path, s.folder) if s.path is not None else None
        except submission.Refused:
            texts[s.id] = None
        if texts[s.id] is None:
            del texts[s.id]
            skipped.append(s.id)
    return texts, skipped


def compare(texts: dict[str, str], starter: str, key: str) -> Similarity:
    try:
        import numpy as np
        from copydetect import CodeFingerprint, compare_files
    except ImportError as err:
        return Similarity([], [], [], 0, [], f"copydetect is not installed ({err}): pip install 'ppo-llm-course[classroom]'")

    def fingerprint(name: str, text: str, boilerplate=None, window: int = GUARANTEE - NOISE + 1):
        # The name's .py picks Pygments' Python lexer; the text comes from memory, not the file.
        return CodeFingerprint(f"{name}.py", NOISE, window, boilerplate=boilerplate, fp=io.StringIO(text))

    # As copydetect's CopyDetector builds its boilerplate: every k-gram hash of the starter (window 1).
    boilerplate = np.unique(np.array(list(fingerprint("starter", starter, window=1).hashes)))
    prints = {sid: fingerprint(sid, text, boilerplate) for sid, text in texts.items()}
    key_print = fingerprint("key", key, boilerplate)

    def pair(a: str, b: str, fa, fb, ta: str, tb: str) -> Pair:
        _, (a_in_b, b_in_a), _ = compare_files(fa, fb)
        # Files too short to fingerprint (shorter than a k-gram) normalize alike but say nothing.
        same = bool(fa.hashes) and fa.filtered_code == fb.filtered_code
        return Pair(a, b, round(float(a_in_b), 3), round(float(b_in_a), 3), same, ta == tb)

    pairs = [pair(a, b, prints[a], prints[b], texts[a], texts[b]) for a, b in itertools.combinations(sorted(texts), 2)]
    markers = sorted(sid for sid, text in texts.items() if MARKER in text)
    against_key = [pair(sid, KEY, prints[sid], key_print, texts[sid], key) for sid in sorted(texts)]
    return Similarity(_ranked([p for p in pairs if p.score >= THRESHOLD or p.same_code]),
                      _ranked([p for p in against_key if p.score >= THRESHOLD or p.same_code or p.a in markers]),
                      markers, len(texts), [])


def relabeled(result: Similarity, labels: dict[str, str]) -> Similarity:
    """``result`` with each grading's id replaced by its label (its students); the key stays."""
    def name(sid: str) -> str:
        return labels.get(sid, sid)

    return dataclasses.replace(
        result, pairs=[dataclasses.replace(p, a=name(p.a), b=name(p.b)) for p in result.pairs],
        key=[dataclasses.replace(p, a=name(p.a)) for p in result.key], markers=[name(m) for m in result.markers],
        skipped=[name(s) for s in result.skipped])


def _ranked(pairs: list[Pair]) -> list[Pair]:
    return sorted(pairs, key=lambda p: (not p.identical, not p.same_code, -p.score, p.a, p.b))


def to_csv(result: Similarity) -> str:
    """Every listed pair, the key's rows included (b = "(answer key)"); UTF-8 with a BOM as gradebook.csv."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["student_a", "student_b", "similarity", "a_in_b", "b_in_a", "same_code", "identical",
                     "key_markers"])
    for p in result.key + result.pairs:
        writer.writerow([p.a, p.b, f"{p.score:.3f}", f"{p.a_in_b:.3f}", f"{p.b_in_a:.3f}", _yes(p.same_code),
                         _yes(p.identical), _yes(p.b == KEY and p.a in result.markers)])
    return "\ufeff" + buffer.getvalue()


def to_markdown(result: Similarity) -> str:
    lines = ["# Similarity", ""]
    if result.missing:
        return "\n".join(lines + [f"Not compared: {result.missing}."]) + "\n"
    lines += [f"{result.compared} submissions compared with copydetect's winnowing fingerprints, the starter code's "
              f"lines left out; listed from {THRESHOLD:.0%} (the share of one file's code found in the other). "
              "\"same code\": equal once names, comments and layout are normalized. A list of what to look at, "
              "not a verdict.", ""]
    if result.skipped:
        lines += [f"Not compared (no readable file): {', '.join(result.skipped)}.", ""]
    lines += ["## Submissions that match the answer key", ""]
    if result.key:
        lines += ["| student | similarity | same code | identical file | key's solution markers |", "|---|---:|---|---|---|"]
        lines += [f"| {p.a} | {p.score:.0%} | {_yes(p.same_code)} | {_yes(p.identical)} | {_yes(p.a in result.markers)} |"
                  for p in result.key]
    else:
        lines.append("None.")
    lines += ["", "## Pairs of students", ""]
    if result.pairs:
        lines += ["| student | student | similarity | A in B | B in A | same code | identical file |",
                  "|---|---|---:|---:|---:|---|---|"]
        lines += [f"| {p.a} | {p.b} | {p.score:.0%} | {p.a_in_b:.0%} | {p.b_in_a:.0%} | {_yes(p.same_code)} | "
                  f"{_yes(p.identical)} |" for p in result.pairs]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def _yes(flag: bool) -> str:
    return "yes" if flag else ""


def report(students: list[Student], starter: Path, key: Path) -> Similarity:
    """Compare the class in a child process with a fixed hash seed (see the module's docstring)."""
    texts, skipped = sources(students)
    payload = json.dumps({"texts": texts, "starter": Path(starter).read_text(encoding="utf-8"),
                          "key": Path(key).read_text(encoding="utf-8")})
    proc = subprocess.run([sys.executable, "-m", __name__], input=payload, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return Similarity([], [], [], 0, skipped, f"the comparison failed ({last})")
    data = json.loads(proc.stdout)
    return Similarity([Pair(**p) for p in data["pairs"]], [Pair(**p) for p in data["key"]], data["markers"],
                      data["compared"], skipped, data["missing"])


def _main() -> None:
    """The child of ``report``: JSON {texts, starter, key} in, the Similarity as JSON out."""
    given = json.loads(sys.stdin.read())
    json.dump(dataclasses.asdict(compare(given["texts"], given["starter"], given["key"])), sys.stdout)


if __name__ == "__main__":
    _main()
