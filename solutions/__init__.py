"""The answer key: ``exercises.py`` holds the single source of the five solutions.

Staff only, never released to students. ``ppo-course stubs`` (course/stubs.py) derives the
student copy ``assignment/exercises.py`` from it.
"""
