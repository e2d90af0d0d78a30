"""Course staff tooling (``ppo-course``): generate the blanks from the answer key, release the
student folder, build and test the Gradescope autograder, demo the grader.

Imports point one way: the student package (assignment) <- the answer key (solutions) <- the
grader (autograder) and this tooling.
"""
