"""Indexing takes rows of an array; a float layer has none."""
# expect: Value of type "FloatLayer" is not indexable [index]

from monadl import FloatWeight

bad = (FloatWeight(1.0) * 2.0)[0]  # error
