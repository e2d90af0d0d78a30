"""A class as its platform hands it over: Gradescope's, Canvas's and Moodle's submission downloads.

``discover_class`` recognises the layout of a submissions folder (or takes the one named by
``--layout``) and returns its gradings, each with the real students it counts for (discovery.Person:
a key unique in the class, and the name, ids and email the platform gives), so that every output
is keyed by the student, never by a file name. What cannot be read as the platform writes it is
a notice and, where a student is concerned, a note in that student's gradebook row: never a
silent drop. Every grading has its own id (its results file); two that would share one (names
alike once made safe) are told apart with -2, -3, ..., noted.

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
  Ruby-only tags (``!ruby/object:BigDecimal`` scores) are read as plain values. A folder the
  metadata lists but the export lacks (a partial unzip) is not graded at all: its students get a
  row with the reason and no grade, so that no upload overwrites their real one.

* **Canvas**, "Download Submissions": one flat folder, each file named
  ``<name>[_LATE]_<user id>_<attachment id>_<file name>`` (an anonymous assignment:
  ``[LATE_]anon_<anonymous id>_<attachment id>_<file name>``), where <name> is the student's
  sortable name, lowercased, with every character that is not a letter, digit or underscore
  removed, and a run ``_<digits>_`` inside it joined, so that the first ``_<digits>_<digits>_``
  after it is the user and attachment ids; LATE is Canvas's own late flag at download time.
  A file the student uploaded again under the same name comes as ``exercises-1.py``. A text
  entry comes as ``<name>[_LATE]_<user id>_text.html`` and a website URL as ``..._link.html``
  (no attachment id): that student gets 0 and the reason. (Canvas's source: lib/content_zipper.rb,
  ``get_filename``, ``sanitize_user_name``, ``add_upload_submission``, ``add_text_or_url``.)
  A name that ends in ``_<digits>`` (joined only when followed by ``_``) makes a file name read
  two ways, as it does for Canvas's own parser; with the gradebook export the reading whose
  user id is in it wins. The key is the user id: a later download (new attachment ids, a ``-N``
  suffix) grades the same student, and Canvas's gradebook export (roster.py) joins on it. A
  group assignment comes as one file, under one member's user id: the other members have no
  file in the download.

* **Moodle**, "Download all submissions": with "download submissions in folders" (Moodle's
  default since 3.1) a folder ``<full name>_<participant id>_assignsubmission_file`` per student,
  else flat files ``<full name>_<participant id>_assignsubmission_file_<file name>``; underscores
  in the name become spaces, so the first ``_<digits>_assignsubmission_`` ends it. The participant
  id is the one Moodle's grading worksheet calls "Participant <id>" (mod/assign/classes/downloader.php,
  ``get_student_prefix``); no Moodle import matches students by it. A team submission comes
  under its group's name and id.

* **plain**: the accepted-names rule of discovery.py (``NAME.py``, ``NAME/exercises.py``).

Which file of a student's is graded is discovery.choose's rule in every layout.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path

from .discovery import (GRADED_NAME, KEY_COLUMN, Candidate, Discovery, Notice, Person, Student, choose, discover,
                        is_submission_name, listing, shown, student_of)

GRADESCOPE, CANVAS, MOODLE, PLAIN = "gradescope", "canvas", "moodle", "plain"
LAYOUTS = ("auto", PLAIN, GRADESCOPE, CANVAS, MOODLE)
METADATA = "submission_metadata.yml"

# Canvas: the user's part is a sanitised name ([[:word:]], so \w), then _LATE, then the ids.
CANVAS_NAME = re.compile(r"(?P<name>\w*?)(?P<late>_LATE)?_(?P<user>\d+)_(?P<attachment>\d+)_(?P<file>.+)")
CANVAS_IDS = re.compile(r"(?P<late>_LATE)?_(?P<user>\d+)_(?P<attachment>\d+)_(?P<file>.+)")  # after the name
CANVAS_ANONYMOUS = re.compile(r"(?P<late>LATE_)?(?P<user>anon_[A-Za-z0-9]+)_(?P<attachment>\d+)_(?P<file>.+)")
# A text entry or a website URL: no attachment, the page Canvas renders (add_text_or_url).
CANVAS_ONLINE = re.compile(r"(?:(?P<name>\w*?)(?P<late>_LATE)?_(?P<user>\d+)"
                           r"|(?P<alate>LATE_)?(?P<anon>anon_[A-Za-z0-9]+))_(?P<kind>text|link)\.html")
CANVAS_SCHEME = "name[_LATE]_userid_attachmentid_filename"
ONLINE = {"text": "a text entry", "link": "a website URL"}
MOODLE_FOLDER = re.compile(r"(?P<name>.+?)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)")
MOODLE_FILE = re.compile(r"(?P<name>.+?)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.+)")
MOODLE_SCHEME = "<full name>_<participant id>_assignsubmission_..."
RESUBMITTED = re.compile(r"-\d+(?=\.[^.]*$)")  # exercises-1.py: the same name uploaded again

COLUMNS = {PLAIN: (), GRADESCOPE: ("name", "sid", "email", "submitted"), CANVAS: ("name", "user id", "late"),
           MOODLE: ("name", "participant id")}
# The field a platform's CSV upload matches students by (grades.csv's sid): the key itself for a
# plain class (the TA's own ids), none for Moodle (its participant id is no id Moodle imports by).
SID_COLUMN = {PLAIN: KEY_COLUMN, GRADESCOPE: "sid", CANVAS: "user id", MOODLE: ""}
SOURCE = {GRADESCOPE: f"a Gradescope export ({METADATA})", CANVAS: "a Canvas download", MOODLE: "a Moodle download",
          PLAIN: "one NAME.py or NAME/ per student"}


class ExportError(ValueError):
    """The export cannot be read as its platform writes it; the message says what to fix."""


def discover_class(root: Path, skip: tuple[Path, ...] = (), layout: str = "auto",
                   known: frozenset[str] = frozenset()) -> Discovery:
    """The gradings of the submissions folder ``root`` and whom each counts for. ``known``: the
    Canvas user ids of the class (its gradebook export), which settle a file name that reads two
    ways. Raises ExportError when the folder is not the layout named (or holds an export beside
    other entries), or its metadata cannot be read."""
    root, notices = Path(root), []
    if layout in ("auto", GRADESCOPE) and not (root / METADATA).is_file():
        entries, leftovers = _listing(root, skip)
        inside = [e for e in entries if e.is_dir() and (e / METADATA).is_file()]
        if len(inside) == 1 and len(entries) == 1:  # the folder the export's zip unzips into
            notices += [Notice(inside[0].name + "/", f"the Gradescope export inside {root} is graded"), *leftovers]
            root = inside[0]
        elif inside or layout == GRADESCOPE:  # unzipped beside its zip, say: which folder is the export
            where = f"{inside[0]} holds a Gradescope export ({METADATA}) and {root} other entries too: " \
                f"pass {inside[0]}" if inside else \
                f"no {METADATA} in {root}: not a Gradescope export (Review Grades, Export Submissions, unzipped)"
            raise ExportError(f"{where} (or --layout plain to grade {root} as one NAME.py or NAME/ per student)")
    if layout == "auto":
        layout = detect(root, skip)
    elif layout in (CANVAS, MOODLE) and not _in_scheme(layout, [e.name for e in _listing(root, skip)[0]]):
        raise ExportError(f"no entry of {root} is named as {SOURCE[layout]} names them "
                          f"({CANVAS_SCHEME if layout == CANVAS else MOODLE_SCHEME}); --layout auto reads it as "
                          f"{SOURCE[detect(root, skip)]}")
    found = _canvas(root, skip, known) if layout == CANVAS else \
        {PLAIN: _plain, GRADESCOPE: _gradescope, MOODLE: _moodle}[layout](root, skip)
    notices = [Notice(shown(n.entry), shown(n.why), n.student and shown(n.student)) for n in notices + found.notices]
    students = _unique_keys(_unique_ids([_printable(s) for s in found.students], notices), notices)
    return Discovery(sorted(students, key=lambda s: s.id), notices, layout, COLUMNS[layout], SID_COLUMN[layout])


def detect(root: Path, skip: tuple[Path, ...] = ()) -> str:
    """Which platform wrote ``root``: its metadata file (Gradescope) or the names of its entries
    (most of them in one platform's scheme)."""
    if (root / METADATA).is_file():
        return GRADESCOPE
    names = [e.name for e in _listing(root, skip)[0]]
    for layout in (MOODLE, CANVAS):
        count = _in_scheme(layout, names)
        if count and count * 2 >= len(names):
            return layout
    return PLAIN


def key_fields(layout: str, key: str) -> dict[str, str]:
    """The fields a student's key alone gives (a roster student without a submission): the
    layout's id column (a Gradescope key is the SID, else the email)."""
    if layout == GRADESCOPE:
        return {"email" if "@" in key else "sid": key}
    return {CANVAS: {"user id": key}, MOODLE: {"participant id": key}}.get(layout, {})


def _in_scheme(layout: str, names: list[str]) -> int:
    """How many of ``names`` are named as ``layout``'s download names its entries."""
    patterns = (MOODLE_FOLDER, MOODLE_FILE) if layout == MOODLE else (CANVAS_NAME, CANVAS_ANONYMOUS, CANVAS_ONLINE)
    return sum(any(p.fullmatch(n) for p in patterns) for n in names)


def _listing(root: Path, skip: tuple[Path, ...]) -> tuple[list[Path], list[Notice]]:
    try:
        return listing(root, skip)
    except OSError as err:
        raise ExportError(f"{root} cannot be listed ({err.strerror})") from None


def _plain(root: Path, skip: tuple[Path, ...]) -> Discovery:
    try:
        return discover(root, skip)
    except OSError as err:
        raise ExportError(f"{root} cannot be listed ({err.strerror})") from None


def safe_key(text: str) -> str:
    """``text`` as a student key: kept readable, safe as a file name (feedback/<key>.md)."""
    return re.sub(r"[^\w.@+-]+", "_", text.strip()).strip("._") or "_"


def _printable(s: Student) -> Student:
    """``s`` with every name that came from the file system as text any output takes (discovery.shown)."""
    people = tuple(dataclasses.replace(p, key=shown(p.key), fields={k: shown(v) for k, v in p.fields.items()},
                                       note=shown(p.note)) for p in s.people)
    return dataclasses.replace(s, id=shown(s.id), problem=shown(s.problem), file=shown(s.file), people=people)


def _unique_ids(students: list[Student], notices: list[Notice]) -> list[Student]:
    """Every grading its own results file (results/<id>.json): a grading whose id an earlier one
    has (two names that are one once made safe: Canvas's stray "a b.py" and "a_b.py", "x.py" and
    "x.PY") is graded as <id>-2, -3, ..., noted. Readers list platform-keyed gradings first, so
    that a stray file never takes a student's id."""
    every = {s.id for s in students}
    first: dict[str, Student] = {}
    out = []
    for s in students:
        if s.id in first:
            n = 2
            while f"{s.id}-{n}" in every:
                n += 1
            sid = f"{s.id}-{n}"
            every.add(sid)
            taken = first[s.id].file or s.id
            notices.append(Notice(s.file or s.id, f"graded as {sid}: the id {s.id} is {taken}'s", sid))
            s = dataclasses.replace(s, id=sid, people=tuple(dataclasses.replace(p, key=sid) if p.key == s.id else p
                                                            for p in s.people))
        first[s.id] = s
        out.append(s)
    return out


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
    found, notices = _listing(root, skip)
    entries = {e.name: e for e in found if e.name != METADATA}
    students, strays = [], []
    for name, record in meta.items():
        people, problem = _submitters(name, record)
        entry = entries.pop(name, None)
        if entry is None:  # a partial unzip: no grade at all, so an upload keeps the real one
            why = f"{name}/ is listed in {METADATA} but is not in the export: unzip the export again"
            students.append(Student(name, None, root, why, people=people, file=name + "/", missing=True))
            notices.append(Notice(name + "/", f"listed in {METADATA} but missing from the export: not graded"))
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
            strays.append(dataclasses.replace(student, people=(Person(name, note=note),)))
            notices += [Notice(name + "/", note, name), *extra]
        else:
            notices.append(Notice(name + ("/" if entry.is_dir() else ""),
                                  f"not a submission of the export (folders submission_<id>/ and {METADATA})"))
    return Discovery(students + strays, notices)


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
    """One entry of a Canvas download, as its name reads."""
    path: Path
    user: str                   # the key: the user id (anon_<id> in an anonymous download)
    name: str                   # the sortable name as the file name has it (lowercased, sanitised)
    late: bool
    order: int | None           # the attachment id (a later upload has a larger one); None: no file
    file: str = ""              # the file name the student uploaded (with Canvas's -N)
    online: str = ""            # "text" or "link": a text entry or a website URL instead of a file


def _canvas_upload(entry: Path, known: frozenset[str]) -> _Upload | None:
    """``entry`` in Canvas's scheme (None: not in it): of the ways its name reads, the first whose
    user id is in ``known``, else the first (the one Canvas's own parser takes)."""
    readings = _canvas_readings(entry)
    return next((r for r in readings if r.user in known), readings[0] if readings else None)


def _canvas_readings(entry: Path) -> list[_Upload]:
    """Every way ``entry``'s name reads, the likeliest first: a user's name split before each
    [_LATE]_<digits>_<digits>_ (a name ending in _12 makes "kimlab_12_4101_90001_x.py" read as
    user 12 or user 4101), an anonymous download's, then a text entry's or URL's page."""
    name, found = entry.name, []
    for i, c in enumerate(name):
        m = CANVAS_IDS.fullmatch(name, i) if c == "_" and re.fullmatch(r"\w*", name[:i]) else None
        if m:
            found.append(_Upload(entry, m["user"], name[:i], bool(m["late"]), int(m["attachment"]), m["file"]))
    if m := CANVAS_ANONYMOUS.fullmatch(name):
        found.append(_Upload(entry, m["user"], "", bool(m["late"]), int(m["attachment"]), m["file"]))
    if m := CANVAS_ONLINE.fullmatch(name):
        found.append(_Upload(entry, m["user"] or m["anon"], m["name"] or "", bool(m["late"] or m["alate"]), None,
                             online=m["kind"]))
    return found


def _canvas(root: Path, skip: tuple[Path, ...], known: frozenset[str] = frozenset()) -> Discovery:
    entries, notices = _listing(root, skip)
    by_user: dict[str, list[_Upload]] = {}
    strays, students = [], []
    for entry in entries:
        upload = _canvas_upload(entry, known) if not entry.is_dir() else None
        if upload is not None:
            by_user.setdefault(upload.user, []).append(upload)
        elif is_submission_name(entry.name) and not entry.is_dir():
            strays.append(entry)
        else:
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  f"not a submission of a Canvas download ({CANVAS_SCHEME})"))
    for user, uploads in sorted(by_user.items()):
        student, extra, note = _canvas_student(user, uploads, root)
        latest = max(uploads, key=lambda u: -1 if u.order is None else u.order)
        person = Person(user, {"name": latest.name, "user id": user, "late": "late" if _late(student, uploads) else ""},
                        note)
        students.append(dataclasses.replace(student, people=(person,)))
        notices += extra
    for entry in strays:  # after the users: a stray never takes a user id's results file (_unique_ids)
        sid = safe_key(entry.name[:-len(".py")])
        note = f"file name not in Canvas's scheme ({CANVAS_SCHEME}): graded, but no Canvas user is known"
        student, _ = student_of(sid, [entry], root)
        students.append(dataclasses.replace(student, people=(Person(sid, note=note),)))
        notices.append(Notice(entry.name, note, sid))
    return Discovery(students, notices)


def _canvas_student(user: str, uploads: list[_Upload], root: Path) -> tuple[Student, list[Notice], str]:
    """The grading of one Canvas user (discovery.choose among the files: Canvas's -N undone, the
    attachment id the order), notices for what is not graded, and the note for the TA."""
    files = [u for u in uploads if not u.online]
    choice = choose("the submission", [Candidate(u.path, RESUBMITTED.sub("", u.file), u.path.name, u.order)
                                       for u in files])
    watch = tuple(u.path for u in uploads)
    if choice.chosen is None:
        online = [u for u in uploads if u.online]
        problem = choice.problem if files or not online else \
            f"{ONLINE[online[0].online]} submitted in Canvas ({online[0].path.name}), not a .py file: " \
            f"submit {GRADED_NAME} as a file upload"
        return Student(user, None, root, problem, watch, file=", ".join(u.path.name for u in uploads)), [], ""
    chosen = choice.chosen.path
    student, _ = student_of(user, [chosen], root)
    notices = [Notice(u.path.name, f"not graded: {chosen.name} is (user {user})", user)
               for u in uploads if u.path != chosen]
    return dataclasses.replace(student, watch=watch), notices, choice.note


def _late(student: Student, uploads: list[_Upload]) -> bool:
    graded = [u for u in uploads if u.path == student.path]
    return any(u.late for u in graded or uploads)


# ---- Moodle -----------------------------------------------------------------------------------------

def _moodle(root: Path, skip: tuple[Path, ...]) -> Discovery:
    entries, notices = _listing(root, skip)
    found: dict[str, list[tuple[Path, str]]] = {}   # participant id -> (entry, full name)
    students = []
    for entry in entries:
        m = (MOODLE_FOLDER.fullmatch(entry.name) if entry.is_dir() else None) or MOODLE_FILE.fullmatch(entry.name)
        if m is None:
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  f"not a submission of a Moodle download ({MOODLE_SCHEME})"))
        elif m["plugin"] != "file":
            notices.append(Notice(entry.name + ("/" if entry.is_dir() else ""),
                                  f"not graded: a Moodle '{m['plugin']}' submission, not a file", m["user"]))
        else:
            found.setdefault(m["user"], []).append((entry, m["name"]))
    for user, given in sorted(found.items()):
        student, extra = _moodle_student(user, [e for e, _ in given], root)
        person = Person(user, {"name": given[0][1], "participant id": user})
        students.append(dataclasses.replace(student, people=(person,)))
        notices += extra
    return Discovery(students, notices)


def _moodle_student(user: str, paths: list[Path], root: Path) -> tuple[Student, list[Notice]]:
    """A folder (or a folder and more): the accepted-names rule; flat files: discovery.choose among them."""
    if any(p.is_dir() for p in paths):
        return student_of(user, paths, root)
    choice = choose("the submission", [Candidate(p, MOODLE_FILE.fullmatch(p.name)["file"], p.name) for p in paths])
    if choice.chosen is None:
        return Student(user, None, root, choice.problem, tuple(paths), file=", ".join(p.name for p in paths)), []
    chosen = choice.chosen.path
    student, _ = student_of(user, [chosen], root)
    extra = [Notice(p.name, f"not graded: {chosen.name} is", user) for p in paths if p != chosen]
    return dataclasses.replace(student, watch=tuple(paths)), extra
