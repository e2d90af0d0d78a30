"""A class as its platform hands it over: Gradescope's, Canvas's and Moodle's submission downloads.

``discover_class`` recognises the layout of a submissions folder (or takes the one named by
``--layout``) and returns its gradings, each with the real students it counts for (discovery.Person:
a key unique in the class, and the name, ids and email the platform gives), so that every output
is keyed by the student, never by a file name. What cannot be read as the platform writes it is
a notice and, where a student is concerned, a note in that student's gradebook row: never a
silent drop.

The formats, as each platform writes them:

* **Gradescope**, "Export Submissions": a folder ``submission_<id>/`` per submission holding the
  files as uploaded, and ``submission_metadata.yml`` beside them mapping each folder name to the
  submission's record, written by Ruby's YAML with symbol keys::

      submission_301000001:
        :submitters:
        - :name: José Müller
          :sid: '12345'
          :email: jose@example.edu
        :created_at: 2025-03-01 23:58:10.000000000 -08:00
        :score: 100.0

  A group submission lists every submitter. Gradescope documents the record of one submission
  (its autograder's ``submission_metadata.json``: the ``users`` with name and email, ``created_at``;
  https://gradescope-autograders.readthedocs.io/en/latest/submission_metadata/); the export's
  file and its ``:submitters:`` / ``:name:`` / ``:sid:`` / ``:email:`` keys are as exports are
  read by the public tools that read them (e.g. github.com/cm090/gradescope-autograder,
  rename-tool/src/GradescopeRenameTool.java). The key is the SID, else the email, else the
  folder's name; the export carries no late flag, so ``submitted`` (``:created_at:``) is shown.
  Ruby-only tags (``!ruby/object:BigDecimal`` scores) are read as plain values.

* **Canvas**, "Download Submissions": one flat folder, each file named
  ``<name>[_LATE]_<user id>_<attachment id>_<file name>`` (an anonymous assignment:
  ``[LATE_]anon_<anonymous id>_<attachment id>_<file name>``), where <name> is the student's
  sortable name, lowercased, with every character that is not a letter, digit or underscore
  removed, and a run ``_<digits>_`` inside it joined, so that the first ``_<digits>_<digits>_``
  after it is the user and attachment ids; LATE is Canvas's own late flag at download time.
  A file the student uploaded again under the same name comes as ``exercises-1.py``. (Canvas's
  source: lib/content_zipper.rb, ``get_filename``, ``sanitize_user_name``, ``add_upload_submission``.)
  The key is the user id: a later download (new attachment ids, a ``-N`` suffix) grades the same
  student, and Canvas's gradebook export (roster.py) joins on it.

* **Moodle**, "Download all submissions": with "download submissions in folders" (Moodle's
  default since 3.1) a folder ``<full name>_<participant id>_assignsubmission_file`` per student,
  else flat files ``<full name>_<participant id>_assignsubmission_file_<file name>``; underscores
  in the name become spaces, so the first ``_<digits>_assignsubmission_`` ends it. The participant
  id is the one Moodle's grading worksheet calls "Participant <id>" (mod/assign/classes/downloader.php,
  ``get_student_prefix``). A team submission comes under its group's name and id.

* **plain**: the accepted-names rule of discovery.py (``NAME.py``, ``NAME/exercises.py``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from pathlib import Path

from .discovery import GRADED_NAME, Discovery, Notice, Person, Student, discover, is_submission_name, student_of

GRADESCOPE, CANVAS, MOODLE, PLAIN = "gradescope", "canvas", "moodle", "plain"
LAYOUTS = ("auto", PLAIN, GRADESCOPE, CANVAS, MOODLE)
METADATA = "submission_metadata.yml"
ARCHIVE_LEFTOVERS = ("__MACOSX",)   # what unzipping on a Mac adds

# Canvas: the user's part is a sanitised name ([[:word:]], so \w), then _LATE, then the ids.
CANVAS_NAME = re.compile(r"(?P<name>\w*?)(?P<late>_LATE)?_(?P<user>\d+)_(?P<attachment>\d+)_(?P<file>.+)")
CANVAS_ANONYMOUS = re.compile(r"(?P<late>LATE_)?(?P<user>anon_[A-Za-z0-9]+)_(?P<attachment>\d+)_(?P<file>.+)")
CANVAS_SCHEME = "name[_LATE]_userid_attachmentid_filename"
MOODLE_FOLDER = re.compile(r"(?P<name>.+?)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)")
MOODLE_FILE = re.compile(r"(?P<name>.+?)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.+)")
RESUBMITTED = re.compile(r"-\d+$")  # exercises-1.py: the same name uploaded again
GRADED_STEM = Path(GRADED_NAME).stem

COLUMNS = {PLAIN: (), GRADESCOPE: ("name", "sid", "email", "submitted"), CANVAS: ("name", "user id", "late"),
           MOODLE: ("name", "participant id")}
SID_COLUMN = {PLAIN: "", GRADESCOPE: "sid", CANVAS: "user id", MOODLE: "participant id"}


class ExportError(ValueError):
    """The export cannot be read as its platform writes it; the message says what to fix."""


def discover_class(root: Path, skip: tuple[Path, ...] = (), layout: str = "auto") -> Discovery:
    """The gradings of the submissions folder ``root`` and whom each counts for. Raises
    ExportError when the folder is not the layout named, or its metadata cannot be read."""
    root = Path(root)
    notices = []
    inner = _wrapped_export(root, skip)
    if inner is not None and layout in ("auto", GRADESCOPE):
        notices += [Notice(inner.name + "/", f"the Gradescope export inside {root} is graded"), *_hidden(root, skip)]
        root = inner
    if layout == "auto":
        layout = detect(root, skip)
    read = {PLAIN: discover, GRADESCOPE: _gradescope, CANVAS: _canvas, MOODLE: _moodle}[layout]
    found = read(root, skip)
    students = _unique_keys(found.students, found.notices)
    return Discovery(students, notices + found.notices, layout, COLUMNS[layout], SID_COLUMN[layout])


def detect(root: Path, skip: tuple[Path, ...] = ()) -> str:
    """Which platform wrote ``root``: its metadata file (Gradescope) or the names of its entries
    (most of them in one platform's scheme)."""
    if (root / METADATA).is_file():
        return GRADESCOPE
    names = [e.name for e in _entries(root, skip)]
    moodle = sum(bool(MOODLE_FOLDER.fullmatch(n) or MOODLE_FILE.fullmatch(n)) for n in names)
    canvas = sum(bool(CANVAS_NAME.fullmatch(n) or CANVAS_ANONYMOUS.fullmatch(n)) for n in names)
    if moodle and moodle * 2 >= len(names):
        return MOODLE
    if canvas and canvas * 2 >= len(names):
        return CANVAS
    return PLAIN


def _entries(root: Path, skip: tuple[Path, ...]) -> list[Path]:
    skipped = {os.path.abspath(p) for p in skip}
    try:
        found = sorted(root.iterdir())
    except OSError as err:
        raise ExportError(f"{root} cannot be listed ({err.strerror})") from None
    return [e for e in found if os.path.abspath(e) not in skipped and not e.name.startswith(".")
            and e.name not in ARCHIVE_LEFTOVERS and e.name != "__pycache__"]


def _wrapped_export(root: Path, skip: tuple[Path, ...]) -> Path | None:
    """The folder a Gradescope export unzips into (assignment_<id>_export/), when ``root`` holds it alone."""
    if (root / METADATA).exists():
        return None
    inside = _entries(root, skip)
    if len(inside) == 1 and inside[0].is_dir() and (inside[0] / METADATA).is_file():
        return inside[0]
    return None


def _hidden(root: Path, skip: tuple[Path, ...]) -> list[Notice]:
    """Notices for what no layout grades: hidden entries and what unzipping leaves."""
    skipped = {os.path.abspath(p) for p in skip}
    return [Notice(e.name + ("/" if e.is_dir() else ""), "hidden, cache or archive entry, not a student")
            for e in sorted(root.iterdir()) if os.path.abspath(e) not in skipped
            and (e.name.startswith(".") or e.name in ARCHIVE_LEFTOVERS or e.name == "__pycache__")]


def safe_key(text: str) -> str:
    """``text`` as a student key: kept readable, safe as a file name (feedback/<key>.md)."""
    return re.sub(r"[^\w.@+-]+", "_", text.strip()).strip("._") or "_"


def _unique_keys(students: list[Student], notices: list[Notice]) -> list[Student]:
    """Every person key once in the class: a student found in two gradings keeps the first key,
    the others get the grading's id beside it and a note (the TA decides which counts)."""
    where: dict[str, list[str]] = {}
    for s in students:
        for p in s.persons:
            where.setdefault(p.key, []).append(s.id)
    twice = {k: ids for k, ids in where.items() if len(ids) > 1}
    if not twice:
        return students
    out = []
    for s in students:
        people = []
        for p in s.persons:
            if p.key in twice:
                note = f"in {len(twice[p.key])} submissions ({', '.join(twice[p.key])}): decide which counts"
                key = p.key if twice[p.key][0] == s.id else f"{p.key}@{s.id}"
                p = dataclasses.replace(p, key=key, note="; ".join(filter(None, [p.note, note])))
                notices.append(Notice(s.file or s.id, f"{p.fields.get('name') or p.key}: {note}", s.id))
            people.append(p)
        out.append(dataclasses.replace(s, people=tuple(people)))
    return out


# ---- Gradescope -------------------------------------------------------------------------------------

def _gradescope(root: Path, skip: tuple[Path, ...]) -> Discovery:
    meta = _read_metadata(root / METADATA)
    entries = {e.name: e for e in _entries(root, skip)}
    entries.pop(METADATA, None)
    students, notices = [], []
    for name, record in meta.items():
        people, problem = _submitters(name, record)
        entry = entries.pop(name, None)
        if entry is None:
            students.append(Student(name, None, root, f"{name}/ is listed in {METADATA} but is not in the export",
                                    people=people, file=name + "/"))
            notices.append(Notice(name + "/", f"listed in {METADATA} but missing from the export: graded 0 with the reason"))
            continue
        student, extra = student_of(name, [entry], root)
        students.append(dataclasses.replace(student, people=people))
        notices += extra
        if problem:
            notices.append(Notice(name + "/", problem, name))
    for name, entry in entries.items():
        if entry.is_dir() and not entry.is_symlink() and name.startswith("submission_"):
            student, extra = student_of(name, [entry], root)
            note = f"not in {METADATA}: graded under its folder's name, no student known"
            students.append(dataclasses.replace(student, people=(Person(name, note=note),)))
            notices += [Notice(name + "/", note, name), *extra]
        else:
            notices.append(Notice(name + ("/" if entry.is_dir() else ""),
                                  f"not a submission of the export (folders submission_<id>/ and {METADATA})"))
    notices += _hidden(root, skip)
    return Discovery(sorted(students, key=lambda s: s.id), notices)


def _read_metadata(path: Path) -> dict:
    import yaml  # PyYAML: declared in the grade extra (omegaconf reads grading.yaml with it too)

    class Loader(yaml.SafeLoader):
        """Safe, and Ruby's tagged values (!ruby/object:BigDecimal scores, ...) read as plain ones."""

    def untagged(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    Loader.add_multi_constructor("!", untagged)
    try:
        with open(path, encoding="utf-8-sig") as f:
            data = yaml.load(f, Loader=Loader)  # noqa: S506 (a SafeLoader)
    except OSError as err:
        raise ExportError(f"cannot read {path}: {err.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ExportError(f"{path} is not YAML as Gradescope writes it ({' '.join(str(err).split())}); "
                          "download the export again") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ExportError(f"{path} does not map submission folders to their records "
                          "(expected 'submission_<id>:' entries with ':submitters:')")
    return data


def _field(record: dict, name: str):
    """A field of a Ruby-written record: its key is a symbol (':name'); a plain one is read too."""
    return record.get(":" + name, record.get(name)) if isinstance(record, dict) else None


def _text(value) -> str:
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return "" if value is None else " ".join(str(value).split())


def _submitters(name: str, record) -> tuple[tuple[Person, ...], str]:
    """The people of one submission, and a problem with its record ("" when none)."""
    submitted = _text(_field(record, "created_at"))
    found = _field(record, "submitters")
    if not isinstance(found, list) or not found:
        note = f"no :submitters: in {METADATA}: graded under its folder's name"
        return (Person(name, {"submitted": submitted}, note),), note
    people = []
    for i, submitter in enumerate(found):
        fields = {"name": _text(_field(submitter, "name")), "sid": _text(_field(submitter, "sid")),
                  "email": _text(_field(submitter, "email")), "submitted": submitted}
        key = fields["sid"] or fields["email"] or (name if len(found) == 1 else f"{name}-{i + 1}")
        note = "" if fields["sid"] or fields["email"] else f"no sid or email in {METADATA}: keyed by the folder"
        people.append(Person(safe_key(key), fields, note))
    return tuple(people), ""


# ---- Canvas -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Upload:
    path: Path
    user: str           # the key
    name: str           # as the file name has it (the sortable name, sanitised)
    late: bool
    order: int          # the attachment id: a later upload has a larger one
    file: str           # the file name the student uploaded (with Canvas's -N)


def _canvas_upload(entry: Path) -> _Upload | None:
    m = CANVAS_NAME.fullmatch(entry.name) or CANVAS_ANONYMOUS.fullmatch(entry.name)
    if m is None:
        return None
    return _Upload(entry, m["user"], m.groupdict().get("name") or "", bool(m["late"]), int(m["attachment"]), m["file"])


def _canvas(root: Path, skip: tuple[Path, ...]) -> Discovery:
    by_user: dict[str, list[_Upload]] = {}
    strays, students, notices = [], [], []
    for entry in _entries(root, skip):
        upload = _canvas_upload(entry) if not entry.is_dir() else None
        if upload is not None:
            by_user.setdefault(upload.user, []).append(upload)
        elif is_submission_name(entry.name) and not entry.is_dir():
            strays.append(entry)
        else:
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  f"not a submission of a Canvas download ({CANVAS_SCHEME})"))
    for user, uploads in sorted(by_user.items()):
        student, extra = _chosen(user, uploads, root)
        latest = max(uploads, key=lambda u: u.order)
        person = Person(user, {"name": latest.name, "user id": user, "late": "late" if _late(student, uploads) else ""},
                        _ambiguity(uploads))
        students.append(dataclasses.replace(student, people=(person,)))
        notices += extra
    for entry in strays:  # graded under the file's name (never a user id's: results/<id>.json is theirs)
        sid = safe_key(entry.name[:-len(".py")])
        sid = f"{sid}-file" if sid in by_user else sid
        note = f"file name not in Canvas's scheme ({CANVAS_SCHEME}): graded, but no Canvas user is known"
        student, _ = student_of(sid, [entry], root)
        students.append(dataclasses.replace(student, people=(Person(sid, note=note),)))
        notices.append(Notice(entry.name, note, sid))
    notices += _hidden(root, skip)
    return Discovery(sorted(students, key=lambda s: s.id), notices)


def _late(student: Student, uploads: list[_Upload]) -> bool:
    graded = [u for u in uploads if u.path == student.path]
    return any(u.late for u in graded or uploads)


def _stem(file: str) -> str:
    """The name the student gave, without Canvas's -N and the extension: exercises-1.py -> exercises."""
    return RESUBMITTED.sub("", file[:-len(".py")]) if is_submission_name(file) else file


def _preferred(uploads: list[_Upload]) -> list[_Upload]:
    """The .py uploads in the order they would be graded: named like the assignment's file first,
    the latest upload first among equals."""
    py = [u for u in uploads if is_submission_name(u.file)]
    return sorted(py, key=lambda u: (_stem(u.file) != GRADED_STEM, -u.order))


def _chosen(user: str, uploads: list[_Upload], root: Path) -> tuple[Student, list[Notice]]:
    ranked = _preferred(uploads)
    if not ranked:
        names = ", ".join(u.path.name for u in uploads)
        return Student(user, None, root, f"no .py file submitted (only {', '.join(u.file for u in uploads)})",
                       tuple(u.path for u in uploads), file=names), []
    chosen = ranked[0]
    student, _ = student_of(user, [chosen.path], root)
    notices = [Notice(u.path.name, f"not graded: {chosen.path.name} is (user {user})", user)
               for u in uploads if u is not chosen]
    return dataclasses.replace(student, watch=tuple(u.path for u in uploads)), notices


def _ambiguity(uploads: list[_Upload]) -> str:
    """The note for a student with several .py files: "" when one is plainly the one to grade."""
    ranked = _preferred(uploads)
    if len(ranked) < 2 or _stem(ranked[0].file) == GRADED_STEM != _stem(ranked[1].file):
        return ""
    return (f"{len(ranked)} .py files ({', '.join(u.path.name for u in ranked)}): graded {ranked[0].path.name}, "
            "the latest upload; check it is the one (a download into a fresh folder has one per student)")


# ---- Moodle -----------------------------------------------------------------------------------------

def _moodle(root: Path, skip: tuple[Path, ...]) -> Discovery:
    found: dict[str, list[tuple[Path, str, str]]] = {}   # participant id -> (entry, name, plugin)
    students, notices = [], []
    for entry in _entries(root, skip):
        m = (MOODLE_FOLDER.fullmatch(entry.name) if entry.is_dir() else None) or MOODLE_FILE.fullmatch(entry.name)
        if m is None:
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  "not a submission of a Moodle download (<full name>_<participant id>_assignsubmission_...)"))
        elif m["plugin"] != "file":
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  f"not graded: a Moodle '{m['plugin']}' submission, not a file", m["user"]))
        else:
            found.setdefault(m["user"], []).append((entry, m["name"], m["plugin"]))
    for user, entries in sorted(found.items()):
        student, extra = _moodle_student(user, [e for e, _, _ in entries], root)
        person = Person(user, {"name": entries[0][1], "participant id": user})
        students.append(dataclasses.replace(student, people=(person,)))
        notices += extra
    notices += _hidden(root, skip)
    return Discovery(students, notices)


def _moodle_student(user: str, paths: list[Path], root: Path) -> tuple[Student, list[Notice]]:
    """A folder: the accepted-names rule inside it; flat files: the same choice among them."""
    if len(paths) == 1 and paths[0].is_dir():
        return student_of(user, paths, root)
    files = [] if any(p.is_dir() for p in paths) else \
        [_Upload(p, user, "", False, 0, MOODLE_FILE.fullmatch(p.name)["file"]) for p in paths]
    ranked = _preferred(files)
    named = [u for u in ranked if _stem(u.file) == GRADED_STEM]
    pick = named[0] if len(named) == 1 else ranked[0] if len(ranked) == 1 else None
    if pick is None:
        listed = ", ".join(p.name for p in paths)
        return Student(user, None, root, f"{len(paths)} entries and none plainly the one to grade ({listed}): "
                       f"submit only {GRADED_NAME}", tuple(paths), file=listed), []
    student, _ = student_of(user, [pick.path], root)
    extra = [Notice(p.name, f"not graded: {pick.path.name} is", user) for p in paths if p != pick.path]
    return dataclasses.replace(student, watch=tuple(paths)), extra
