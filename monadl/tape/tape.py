"""``Tape[Data, Delta]``: the forward data and the way back (defined with the program, in
``monadl.do.values``, whose scheduler makes them)."""

from monadl.do.values import Tape

__all__ = ["Tape"]
