"""The layer types and their operators: what a model is made of.

``layers`` (``FloatLayer``, ``ArrayLayer``, their operators, ``apply``), ``weights``, ``base`` and
``deep_learning`` (the ``DeepLearning`` type class), ``apply`` (an op's node recorded),
``arguments`` and ``indices`` (the checks of the ops' arguments), and ``shapes`` (a layer's static
shape and dtype, walked from the ops' shape rules).
"""
