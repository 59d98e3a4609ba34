"""``Tape[Data, Delta]`` and the backward pass: a run's record read backwards, each node's delta
summed over its consumers before it is passed back once."""

from monadl.do.tape import Tape
from monadl.tape.backward import backward

__all__ = ["Tape", "backward"]
