"""The grader's worker: the one door into student code.

It runs in its own process (and, where the grader can arrange it, its own sandbox), loads the
submission by path, calls what the grader asks for, and sends back plain tensors and JSON. It
never sees the solution: where exercise 5 needs the reference exercises 1-3, it asks the
grader for their values and gradients (``oracle`` frames) instead of running them.
"""
