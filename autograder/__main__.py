from autograder.cli import run

run()
