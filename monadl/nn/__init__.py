"""Building blocks of models: :class:`Module`, a typed container whose weights are found by name."""

from monadl.nn.module import Module, weights_of

__all__ = ["Module", "weights_of"]
