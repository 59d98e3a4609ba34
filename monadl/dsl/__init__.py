"""The typed DSL: layers, weights, operators, ops, optimizers, training and direct style."""
