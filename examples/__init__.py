"""Runnable examples; each is also imported by tests/test_examples.py."""
