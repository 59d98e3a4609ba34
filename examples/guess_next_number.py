"""Guess the next number: the first program of the DeepLearning.scala 2 paper (listings 1-7).

A robot sees three numbers of a sequence and guesses the fourth. Its guess is a dot product of the
question with three trainable weights; training on two examples, ``0, 1, 2 -> 3`` and
``3, 4, 5 -> 6``, teaches it ``42, 43, 44 -> 45``, a question it never trained on: it prints its
answer before and after training.

Run it: ``python examples/guess_next_number.py``.
"""

from __future__ import annotations

import functools
import operator
import random
from collections.abc import Sequence

import monadl
from monadl import FloatLayer, FloatWeight


# Listing 1: the robot's trainable weights, random to begin with.
def new_weights(seed: int = 0) -> list[FloatWeight]:
    rng = random.Random(seed)
    return [FloatWeight(rng.random()) for _ in range(3)]


# Listing 2: the guess is the dot product of the question and the weights, written with map/reduce
# on ordinary Python lists. Each ``*`` and ``+`` builds a differentiable layer.
def dot(question: Sequence[float], weights: Sequence[FloatWeight]) -> FloatLayer:
    products = [element * weight for element, weight in zip(question, weights, strict=True)]
    return functools.reduce(operator.add, products)


# Listing 3: how wrong a guess is.
def square_loss(robot_answer: FloatLayer, expected_answer: float) -> FloatLayer:
    difference = robot_answer - expected_answer
    return difference * difference


# Listing 4: what the robot learns from.
training_questions: list[list[float]] = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
expected_answers: list[float] = [3.0, 6.0]


# Listing 5: one training step on the total loss of all questions: forward, backward, then one SGD
# update of every weight. ``train_blocking`` gives a Result: the loss, or the exception that failed
# the step (and then no weight changed); ``unwrap`` raises that exception.
def train_once(weights: Sequence[FloatWeight], optimizer: monadl.Optimizer) -> float:
    losses = [
        square_loss(dot(q, weights), a) for q, a in zip(training_questions, expected_answers, strict=True)
    ]
    total_loss = functools.reduce(operator.add, losses)
    loss: float = total_loss.train_blocking(optimizer).unwrap()
    return loss


# Listing 7: a question the robot never trained on.
def guess(weights: Sequence[FloatWeight]) -> float:
    answer: float = dot([42.0, 43.0, 44.0], weights).predict_blocking().unwrap()
    return answer


def main(iterations: int = 500) -> float:
    """Trains ``iterations`` times (listing 6), asking the robot about 42, 43, 44 (listing 7) before
    and after; returns its last guess."""
    weights = new_weights()
    print(f"before training: 42, 43, 44 -> {guess(weights):.4f}")
    optimizer = monadl.SGD(learning_rate=0.01)
    for i in range(iterations):
        loss = train_once(weights, optimizer)
        if i % 100 == 0 or i == iterations - 1:
            print(f"iteration {i:3d}: loss {loss:.8f}")
    answer = guess(weights)
    print(f"after training: 42, 43, 44 -> {answer:.4f}")
    return answer


if __name__ == "__main__":
    main()
