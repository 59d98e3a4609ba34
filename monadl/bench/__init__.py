"""Benchmarks of monadl, run as ``python -m monadl.bench COMMAND`` (see ``--help``).

``overhead``: the per-op overhead of monadl's forward and forward + backward passes, against the same
math written by hand in plain NumPy (and PyTorch eager, when it is installed). Speed is measured here,
in benchmarks that report medians over repeats, never in timed tests.
"""
