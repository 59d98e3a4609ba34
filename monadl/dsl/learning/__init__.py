"""Training: the all-or-nothing step (``training``), optimizers and gradient transforms
(``optimizers``), learning-rate schedules (``schedules``), ``apply_gradients``, and the step's
results (``results``)."""
