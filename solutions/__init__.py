"""Staff-only package: the single source of the five solutions and the course tooling.

Never released to students. ``ppo-course stubs`` derives the student copy
``assignment/exercises.py`` from ``solutions/exercises.py``.
"""
