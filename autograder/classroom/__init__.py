"""Class grading (``ppo-grade FOLDER --out DIR``): a folder of submissions into a gradebook a TA acts on.

One module per role, each importing only modules earlier in this list (tests/test_architecture.py):

    discovery   who is in the class, and every entry that is not graded (the accepted-names rule)
    exports     a platform's download (Gradescope, Canvas, Moodle): the gradings and their real students
    grading     one grading: results/<id>.json, or the grader's own failure on file
    pool        the grading processes, each with its own sandbox
    state       resuming: who needs grading (--restart, --only)
    status      per-exercise status and the student's reason, read from a results file
    gradebook   the rows and gradebook.csv
    roster      --roster: names and emails by student id; Canvas's gradebook export
    upload      grades.csv and canvas-import.csv: the grades in the files platforms import
    summary     summary.md and the score histogram
    similarity  alike pairs and matches of the answer key (copydetect)
    feedback    feedback/<student>.md, what each student sees
    run         grade_class: the whole run, for the CLI

The CLI (autograder/cli.py) imports ``run``; nothing here imports the CLI.
"""
