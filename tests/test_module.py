"""Modules (``monadl.nn.Module``): every weight found, named by its path, in a stable order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from returns.result import Success

import monadl as ml
from monadl import ArrayWeight, FloatWeight


@dataclass
class Affine(ml.Module):
    w: ArrayWeight
    b: ArrayWeight

    def __call__(self, x: ml.ArrayLayer | np.ndarray) -> ml.ArrayLayer:
        return ml.linear(x, self.w, self.b)


@dataclass
class Cell(ml.Module):
    i: Affine
    f: Affine
    scale: FloatWeight
    width: int = 3  # not a weight: skipped


@dataclass
class Net(ml.Module):
    cells: list[Cell]
    heads: dict[str, Affine] = field(default_factory=dict)
    extra: tuple[ArrayWeight, ...] = ()


def affine(seed: int) -> Affine:
    return Affine(ArrayWeight.normal((3, 3), seed=seed), ArrayWeight.zeros((3,)))


def net() -> Net:
    cells = [Cell(affine(2 * k), affine(2 * k + 1), FloatWeight(0.5)) for k in range(2)]
    return Net(cells, {"out": affine(9)}, (ArrayWeight.zeros((2,)),))


def test_weights_are_named_by_their_path_depth_first_in_field_order() -> None:
    assert list(net().weights()) == [
        "cells.0.i.w",
        "cells.0.i.b",
        "cells.0.f.w",
        "cells.0.f.b",
        "cells.0.scale",
        "cells.1.i.w",
        "cells.1.i.b",
        "cells.1.f.w",
        "cells.1.f.b",
        "cells.1.scale",
        "heads.out.w",
        "heads.out.b",
        "extra.0",
    ]


def test_a_shared_weight_is_listed_once_under_its_first_path() -> None:
    shared = affine(0)
    model = Net([Cell(shared, shared, FloatWeight(1.0))])
    assert list(model.weights()) == ["cells.0.i.w", "cells.0.i.b", "cells.0.scale"]
    assert model.weights()["cells.0.i.w"] is shared.w


def test_a_plain_class_and_structures_of_modules() -> None:
    class Plain(ml.Module):
        def __init__(self) -> None:
            self.first = ArrayWeight.zeros((1,))
            self.rate = 0.1
            self.second = affine(3)

    assert list(Plain().weights()) == ["first", "second.w", "second.b"]
    a, b = affine(0), affine(1)
    assert list(ml.weights_of([a, {"b": b}])) == ["0.w", "0.b", "1.b.w", "1.b.b"]
    assert list(ml.weights_of(ArrayWeight.zeros((1,), name="bias"))) == ["bias"]


def test_a_module_that_refers_back_to_its_parent_is_walked_once() -> None:
    @dataclass
    class Node(ml.Module):
        w: ArrayWeight
        parent: object = None

    root = Node(ArrayWeight.zeros((1,)))
    child = Node(ArrayWeight.zeros((1,)), root)
    root.parent = child
    assert list(root.weights()) == ["w", "parent.w"]


@pytest.mark.parametrize("key", ["a.b", "", 1.5])
def test_a_dict_key_that_cannot_be_a_name_is_an_error(key: object) -> None:
    with pytest.raises((TypeError, ValueError), match="weights_of"):
        ml.weights_of({key: affine(0)})


def test_a_module_trains() -> None:
    model = net()
    x = np.ones((4, 3))
    loss = ml.sum(ml.tanh(model.heads["out"](model.cells[0].i(x))))
    before = {name: np.asarray(w.data).copy() for name, w in model.weights().items()}
    assert isinstance(loss.train_blocking(ml.SGD(0.1)), Success)
    moved = [
        name for name, w in model.weights().items() if not np.array_equal(np.asarray(w.data), before[name])
    ]
    assert moved == ["cells.0.i.w", "cells.0.i.b", "heads.out.w", "heads.out.b"]


# -------------------------------------------------------------------------------------- buffers


@dataclass
class Noisy(ml.Module):
    body: Affine
    drop: ml.Dropout
    mean: ml.ArrayBuffer
    more: list[ml.Buffer] = field(default_factory=list)


def test_buffers_are_named_by_their_path_in_the_order_weights_are() -> None:
    model = [Noisy(affine(0), ml.Dropout(0.5), ml.ArrayBuffer(np.zeros(3)), [ml.GeneratorBuffer(1)])]
    assert list(ml.buffers_of(model)) == ["0.drop.generator", "0.mean", "0.more.0"]
    assert ml.buffers_of(model)["0.drop.generator"] is model[0].drop.generator
    assert list(ml.weights_of(model)) == ["0.body.w", "0.body.b"]  # a buffer is no weight
    assert list(model[0].drop.buffers()) == ["generator"] and model[0].drop.weights() == {}
    assert list(ml.buffers_of(ml.ArrayBuffer(np.zeros(1)))) == ["buffer"]


def test_a_shared_buffer_is_listed_once_under_its_first_path() -> None:
    drop = ml.Dropout(0.5)
    model = {"a": Noisy(affine(0), drop, ml.ArrayBuffer(np.zeros(1))), "b": drop}
    assert list(ml.buffers_of(model)) == ["a.drop.generator", "a.mean"]
    generator = ml.GeneratorBuffer(3)
    assert ml.Dropout(0.5, seed=generator).generator is generator  # (its own, where it is a buffer)
    assert list(ml.buffers_of([ml.Dropout(0.1, seed=generator), ml.Dropout(0.2, seed=generator)])) == [
        "0.generator"
    ]


def test_a_dict_key_that_cannot_be_a_name_is_an_error_naming_buffers_of() -> None:
    with pytest.raises(ValueError, match="buffers_of: a dict key must be non-empty"):
        ml.buffers_of({"a.b": ml.ArrayBuffer(np.zeros(1))})
