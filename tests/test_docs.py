"""The documentation holds: every link, anchor and cited file of the project's Markdown pages and
of the student release's exists (course/links.py), no file cites an issue by its number, the
README stays short with its two fresh-machine commands, and the figures its headline and the
handout state are the committed runs' own."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from course import links, release

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -c autograder/gradescope/constraints.txt -e '.[dev]'"


def test_every_page_of_the_project_links_only_what_exists():
    pages = links.markdown_files(ROOT)
    assert {ROOT / name for name in ("README.md", "handout.md", "docs/students.md", "reports/multi_gpu.md")} <= set(pages)
    assert links.check(ROOT) == []


def test_every_page_of_the_student_release_links_only_what_exists(tmp_path):
    out = release.build_student_release(tmp_path / "release")  # which checks its links itself (below)
    assert (out / "README.md").read_text().startswith("# PPO for language models: your assignment")
    assert len(links.markdown_files(out)) >= 2 and links.check(out) == []


ISSUE_12 = "issue" + " 12"  # spelled so that this file cites none
PLANTED = {
    "docs/a.md": """# A page

## Setup

See [the other page](b.md), [its section](b.md#usage), [here](#setup), [the web](https://example.org/x),
`reports/real.md` and `reports/NAME.md` (a placeholder), `results/ID.json` (what a command writes).

```bash
cat reports/real.md   # [not a link](nowhere.md) inside a code block
```

Broken: [gone](missing.md), [no such section](b.md#install), [nor here](#usage),
`reports/gone.md`, and see {issue_12}.

```bash
python benchmarks/gone.py
```
""".format(issue_12=ISSUE_12),
    "docs/b.md": "# B\n\n## Usage\n\n## Usage\n\nThe second one is [#usage-1](#usage-1).\n",
    "reports/real.md": "# Real\n",
    "benchmarks/kept.py": "",
}


def test_the_link_check_catches_each_kind_of_break(tmp_path):
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = links.check(tmp_path)
    assert found == [f"docs/a.md:13: cites '{ISSUE_12}', which no reader can resolve",
                     "docs/a.md:12: links to missing.md, which does not exist",
                     "docs/a.md:12: links to #install of docs/b.md, no such heading",
                     "docs/a.md:12: links to #usage of docs/a.md, no such heading",
                     "docs/a.md:13: cites reports/gone.md, which does not exist",
                     "docs/a.md:15: cites benchmarks/gone.py, which does not exist"], found


def test_a_broken_link_stops_the_release_before_students_see_it(tmp_path, monkeypatch):
    page = tmp_path / "students.md"
    page.write_text(release.STUDENT_README.read_text() + "\nCompare with [the runs](../docs/results.md).\n")
    monkeypatch.setattr(release, "STUDENT_README", page)
    with pytest.raises(release.LinkError, match=r"README.md:\d+: links to docs/results.md, which does not exist"):
        release.build_student_release(tmp_path / "release")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).is_file() and not n.endswith((".gz", ".png", ".pdf", ".whl"))]


def test_no_file_cites_an_issue_by_its_number():
    cited = []
    for path in tracked_text_files():
        for number, line in enumerate(path.read_text(errors="ignore").splitlines(), 1):
            if links.ISSUE.search(line):
                cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert cited == []


def test_the_readme_is_short_and_keeps_its_two_fresh_machine_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    blocks = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    assert blocks == [f"{INSTALL} && .venv/bin/ppo-course demo", f"{INSTALL} && .venv/bin/python -m pytest"]
    assert (ROOT / ".ci" / "run").read_text().splitlines()[-1] == blocks[1]  # CI runs the README's test command


def final_accuracy(folder: Path) -> tuple[float, float]:
    """The first and the last greedy evaluation of a CPU demo run's eval.jsonl."""
    records = [json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()]
    return records[0]["eval/accuracy"], records[-1]["eval/accuracy"]


def test_the_readme_headline_and_the_handout_state_the_committed_runs():
    demo = [final_accuracy(ROOT / "reports" / "cpu_synthetic_metrics" / f"seed{seed}") for seed in (0, 1, 2)]
    assert {before for before, _ in demo} == {0.0}
    readme = " ".join(README.read_text().split())
    assert (f"goes from 0 to {demo[0][1]:.1%} greedy accuracy on two-operand sums in 400 PPO steps (seed 0; "
            f"seeds 1 and 2 reach {demo[1][1]:.0%} and {demo[2][1]:.0%})") in readme
    handout = " ".join((ROOT / "handout.md").read_text().split())
    assert f"the 200 test sums 0% -> {demo[0][1]:.1%}, {demo[1][1]:.1%} and {demo[2][1]:.1%}" in handout
    shipped = json.loads((ROOT / "reports" / "gsm8k_qwen_coder" / "summary.json").read_text())
    assert (f"from {shipped['accuracy_before']:.1%} to {shipped['accuracy_after']:.1%} in 48 PPO steps "
            f"(exact McNemar p = {shipped['mcnemar_p']:.1e})") in readme
    # the recipe's spread across seeds: tests/test_seed_runs.py
