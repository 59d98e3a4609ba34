"""Checkpoint metadata are JSON values: an array is not one."""
# expect: Dict entry 0 has incompatible type "str": "ndarray[ [dict-item]

import numpy as np

import monadl as ml

ml.save("m.safetensors", ml.ArrayWeight(np.ones(2)), metadata={"mean": np.ones(2)})  # error
