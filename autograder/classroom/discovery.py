"""Who is in the class: the students of a submissions folder, and every entry that is not graded.

The accepted-names rule (README, "Grading a class"):

* ``ID.py`` at the top of the folder is student ID's submission. The extension is matched in any
  letter case (``rita.PY`` is rita's), because upload tools and Windows keep what the student
  typed and dropping the file would cost a student their grade over a capital letter; the
  capitals are noted.
* ``ID/`` is student ID's folder: ``ID/exercises.py`` is graded; a folder without exercises.py
  may hold exactly one ``.py`` file instead, graded in its place. Every other entry of the
  folder is not graded and is noted (``xavier/exercises_old.py`` beside xavier/exercises.py).
* Anything else under a student's name (a link, a folder with no or several .py files, two
  submissions for one id) gets 0 points and the reason, as a single grading of an unreadable
  file does.
* Every other top-level entry (``notes.txt``, ``dave.zip``, ``.DS_Store``, ``__pycache__``, the
  ``__MACOSX`` a Mac's unzip leaves) is not a student; it is noted, so that nothing is dropped in
  silence.

Which file of a submission is graded (``choose``; the same rule for a student's folder, a Canvas
student's files and Moodle's flat files): the one named ``exercises.py``, else the only ``.py``
file. Where several qualify, a platform that numbers uploads (Canvas) has its latest graded, with
a note naming the others; where none does, none is graded and the reason says to submit one.

A file name that is not UTF-8 (Python keeps its bytes as surrogates) is written ``\\xNN`` in
every text the class outputs hold (``shown``), so that no output fails on it.

The notes reach the terminal and summary.md (run.py, summary.py).

A platform's export (exports.py) uses the same rule inside each submission's folder, and says who
the real students are: a ``Student`` here is one grading (a file, its results file), and its
``people`` are the students it counts for (a group submission has several).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SUFFIX = ".py"
GRADED_NAME = "exercises.py"
LEFTOVERS = ("__pycache__", "__MACOSX")  # a cache, and what unzipping on a Mac adds
KEY_COLUMN = "student"      # the gradebook's column of Person.key


@dataclass(frozen=True)
class Person:
    """A real student whom a grading counts for."""
    key: str                    # the gradebook's `student`: unique in the class, safe as a file name
    fields: dict[str, str] = field(default_factory=dict)  # name, sid, email, ... as the platform gives them
    note: str = ""              # what the TA must look at about who this is (a name not understood, ...)


@dataclass(frozen=True)
class Student:
    """One grading: a file and its results file (results/<id>.json)."""
    id: str
    path: Path | None           # the file to grade; None when the layout is wrong
    folder: Path                # the file must lie inside it once links are resolved
    problem: str = ""           # why there is nothing to grade, for the student
    watch: tuple[Path, ...] = ()  # what, changed, makes a result stale
    people: tuple[Person, ...] = ()  # whom it counts for; none: the student named ``id``
    file: str = ""              # what was graded, relative to the submissions folder (for the TA)
    # The platform lists it but the folder lacks it (a partial unzip): not graded, no grade at all
    # (a 0 uploaded would overwrite the real one); ``problem`` says why.
    missing: bool = False

    @property
    def persons(self) -> tuple[Person, ...]:
        return self.people or (Person(self.id),)


@dataclass(frozen=True)
class Notice:
    """An entry of the submissions folder that was not graded, or not graded as named."""
    entry: str                  # relative to the submissions folder, a folder with a trailing /
    why: str
    student: str | None = None  # the student it belongs to, if any

    def __str__(self) -> str:
        return f"{self.entry}: {self.why}"


@dataclass(frozen=True)
class Discovery:
    students: list[Student]
    notices: list[Notice]
    layout: str = "plain"       # plain, or the platform whose export this is (exports.py)
    columns: tuple[str, ...] = ()  # the fields of Person the layout gives, in the gradebook's order
    sid_column: str = KEY_COLUMN  # the platform's student id: the key itself, a field of Person, "" (none)

    @property
    def ignored(self) -> list[str]:
        """The entries that are no student's (the summary's list before notices existed)."""
        return [n.entry for n in self.notices if n.student is None]


def is_submission_name(name: str) -> bool:
    return name.lower().endswith(SUFFIX) and len(name) > len(SUFFIX)


def shown(text: str) -> str:
    """A name from the file system as text every output takes: bytes that are not UTF-8 (which
    Python keeps as surrogates) as \\xNN escapes; any other lone surrogate as \\udNNN."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name gives (an exception's message, say)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def is_leftover(name: str) -> bool:
    """A hidden entry, a cache or what unzipping leaves: never a submission, in any layout."""
    return name.startswith(".") or name in LEFTOVERS


def listing(root: Path, skip: tuple[Path, ...] = ()) -> tuple[list[Path], list[Notice]]:
    """The entries of ``root`` that may be submissions, sorted, and a notice for each leftover
    (``skip``: folders that are not listed at all, the out folder). Raises OSError."""
    skipped = {os.path.abspath(p) for p in skip}
    entries, notices = [], []
    for entry in sorted(Path(root).iterdir()):
        if os.path.abspath(entry) in skipped:
            continue
        if is_leftover(entry.name):
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  "hidden, cache or archive entry, not a student"))
        else:
            entries.append(entry)
    return entries, notices


def discover(root: Path, skip: tuple[Path, ...] = ()) -> Discovery:
    """The students of the folder ``root``, sorted by id (``skip``: folders that are not students),
    and a notice for every entry that is not graded or graded under a name the rule bends."""
    root = Path(root)
    found, notices = listing(root, skip)
    entries: dict[str, list[Path]] = {}
    for entry in found:
        name = entry.name
        if is_submission_name(name) or entry.is_symlink() or entry.is_dir():
            sid = name[:-len(SUFFIX)] if is_submission_name(name) else name
            entries.setdefault(sid, []).append(entry)
            if is_submission_name(name) and not name.endswith(SUFFIX):
                notices.append(Notice(name, f"graded as {sid}'s submission (the extension is not lowercase .py)", sid))
        else:
            notices.append(Notice(name, f"not a student: a submission is NAME.py or a folder NAME/ "
                                        f"(rename it to NAME.py if it is one)"))
    students = []
    for sid, given in sorted(entries.items()):
        student, extra = student_of(sid, given, root)
        students.append(student)
        notices += extra
    return Discovery(students, notices)


@dataclass(frozen=True)
class Candidate:
    """A file that may be a submission's graded one."""
    path: Path
    name: str                   # as the student named it (a platform's renaming undone: Canvas's -N)
    shown: str                  # as the TA finds it (its entry's name, relative to its folder)
    order: int | None = None    # the platform's upload order (Canvas's attachment id); None: not known


@dataclass(frozen=True)
class Choice:
    chosen: Candidate | None
    problem: str = ""           # why none is graded (for the student)
    note: str = ""              # several qualified and the latest was graded: which (for the TA)


def choose(where: str, files: list[Candidate]) -> Choice:
    """The file of a submission to grade among ``files`` (``where``: how the reason names the
    submission): the one named exercises.py (in any case if none is so named exactly), else the
    only .py file; several that qualify give the latest upload where every one has an order
    (with a note), else none (a problem)."""
    python = [f for f in files if is_submission_name(f.name) and not f.name.startswith(".")]
    # exercises.py, else the name in another case (exercises.PY: upload tools keep what was typed)
    named = [f for f in python if f.name == GRADED_NAME] or [f for f in python if f.name.lower() == GRADED_NAME]
    pool = named or python
    listed = ", ".join(f.shown for f in pool)
    if len(pool) == 1:
        return Choice(pool[0])
    if not pool:
        others = [f.shown for f in files if not is_leftover(f.name)]
        only = f" (only {', '.join(others)})" if others else ""
        return Choice(None, f"{where} holds no .py file{only}: submit {GRADED_NAME}")
    if all(f.order is not None for f in pool):
        pool = sorted(pool, key=lambda f: -f.order)
        return Choice(pool[0], note=f"{len(pool)} .py files ({', '.join(f.shown for f in pool)}): graded {pool[0].shown}, "
                                    "the latest upload; check it is the one (a download into a fresh folder has one "
                                    "per student)")
    if named:
        return Choice(None, f"{where} holds {len(pool)} files named {GRADED_NAME} ({listed}): submit only one")
    return Choice(None, f"{where} holds {len(pool)} .py files ({listed}) and no {GRADED_NAME}: submit only {GRADED_NAME}")


def student_of(sid: str, entries: list[Path], root: Path) -> tuple[Student, list[Notice]]:
    """The grading ``sid`` of the entries found under its name (the accepted-names rule), and a
    notice for each entry of its folder that is not graded."""
    if len(entries) > 1:
        names = " and ".join(e.name + ("/" if e.is_dir() else "") for e in entries)
        return Student(sid, None, root, f"two submissions under one name: {names}; submit only one",
                       tuple(entries), file=names), []
    entry = entries[0]
    if not entry.is_dir() or entry.is_symlink() or is_submission_name(entry.name):
        # submission.read refuses links, folders, FIFOs
        return Student(sid, entry, root, "", (entry,), file=entry.name), []
    try:
        inside = sorted(entry.iterdir())
    except OSError as err:
        return Student(sid, None, entry, f"{entry.name}/ cannot be listed ({err.strerror})", (entry,),
                       file=entry.name + "/"), []
    choice = choose(f"{entry.name}/", [Candidate(p, p.name, p.name) for p in inside])
    if choice.chosen is None:
        return Student(sid, None, entry, choice.problem, (entry,), file=entry.name + "/"), []
    chosen = choice.chosen.path
    notices = [Notice(f"{entry.name}/{p.name}" + ("/" if p.is_dir() and not p.is_symlink() else ""),
                      f"not graded: {entry.name}/{chosen.name} is", sid)
               for p in inside if p != chosen and p.name != "__pycache__"]
    return Student(sid, chosen, entry, "", (entry, chosen), file=f"{entry.name}/{chosen.name}"), notices


def stamp(student: Student) -> list:
    """What the files of ``student`` look like now; any change (a touch, a new upload) changes it."""
    found = []
    for path in student.watch:
        try:
            st = os.lstat(path)
            found.append([st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            found.append(None)
    return found
