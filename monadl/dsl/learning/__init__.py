"""Training: the all-or-nothing step (``training``, its finite checks in ``finite``), optimizers and
gradient transforms (``optimizers``: a module per family), learning-rate schedules (``schedules``),
``apply_gradients``, and the step's results (``results``)."""
