"""``Tape[Data, Delta]`` and reference-counted shared tapes."""

from monadl.tape.shared import SharedTape, StepContext, current_step
from monadl.tape.tape import Tape

__all__ = ["SharedTape", "StepContext", "Tape", "current_step"]
