"""Type classes: ``DeepLearning`` (Data, Delta, forward), delta monoids, the array backend."""

from monadl.typeclasses.backend import Array, ShapeError, namespace
from monadl.typeclasses.deep_learning import DeepLearning
from monadl.typeclasses.monoid import SUM, Monoid
from monadl.typeclasses.sparse import SparseRows

__all__ = ["SUM", "Array", "DeepLearning", "Monoid", "ShapeError", "SparseRows", "namespace"]
