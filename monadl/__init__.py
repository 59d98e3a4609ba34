"""monadl: a statically typed, monadic deep-learning library.

Layers (differentiable expressions) and weights (trainable variables) of float and array type mix
with plain floats and arrays in operators and ops; ``loss.train(optimizer)`` runs one all-or-nothing
training step; independent sub-graphs run in parallel on the executor's thread pool.
"""

# First: whether the engine runs compiled (mypyc) or from its .py files, decided before any other
# module of the package is imported (see monadl/_compiled.py). ``monadl.compiled()`` tells which.
from monadl._compiled import compiled as compiled
from monadl.checkpoint import CheckpointError, load, save
from monadl.data.loader import DataLoader
from monadl.do import Do, Executor, default_executor, gather, gc_paused, pure, set_default_executor
from monadl.do.context import RunContext
from monadl.dsl.core.deep_learning import DeepLearning
from monadl.dsl.core.layers import (
    AnyArray,
    AnyFloat,
    AnyLayer,
    ArrayLayer,
    ArrayOperators,
    FloatLayer,
    FloatOperators,
)
from monadl.dsl.core.shapes import static_info as _static_info  # noqa: F401 - it gives layers their .shape
from monadl.dsl.core.weights import ArrayWeight, FloatWeight
from monadl.dsl.extend.custom import CustomOp, ShapeRuleError, custom_op
from monadl.dsl.extend.direct import direct, parallel
from monadl.dsl.extend.operation import batchable
from monadl.dsl.learning.apply_gradients import apply_gradients
from monadl.dsl.learning.optimizers.adagrad import Adagrad, RMSprop
from monadl.dsl.learning.optimizers.adam import Adam, AdamW
from monadl.dsl.learning.optimizers.base import GradientTransform, Optimizer
from monadl.dsl.learning.optimizers.clipping import (
    Chain,
    chain,
    clip_by_global_norm,
    clip_by_value,
    global_norm,
)
from monadl.dsl.learning.optimizers.sgd import SGD, Momentum
from monadl.dsl.learning.schedules import (
    Constant,
    CosineDecay,
    LearningRate,
    LinearWarmup,
    Schedule,
    StepDecay,
)
from monadl.dsl.learning.training import (
    NonFiniteBufferError,
    NonFiniteGradientError,
    NonFiniteLossError,
    NoOptimizerError,
    compute_gradients,
    is_training,
    predict,
    predict_blocking,
    train,
    train_blocking,
)
from monadl.dsl.ops.activations import (
    clip,
    elu,
    gelu,
    leaky_relu,
    log_softmax,
    relu,
    sigmoid,
    silu,
    softmax,
    softplus,
    tanh,
)
from monadl.dsl.ops.adaptive_pool import adaptive_avg_pool2d
from monadl.dsl.ops.attention import scaled_dot_product_attention
from monadl.dsl.ops.batch_norm import batch_norm
from monadl.dsl.ops.classification import cross_entropy, nll_loss
from monadl.dsl.ops.conv import conv1d, conv2d
from monadl.dsl.ops.conv_transpose import conv_transpose2d
from monadl.dsl.ops.elementwise import (
    abs,
    add_n,
    exp,
    lift,
    lift_array,
    lift_float,
    log,
    maximum,
    minimum,
    sqrt,
)
from monadl.dsl.ops.flatten import flatten
from monadl.dsl.ops.linalg import dot, linear, matmul
from monadl.dsl.ops.losses import (
    Reduction,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    huber_loss,
    l1_loss,
    mse_loss,
    smooth_l1_loss,
)
from monadl.dsl.ops.norm import group_norm, layer_norm, rms_norm
from monadl.dsl.ops.padding import PadMode, pad
from monadl.dsl.ops.pooling import avg_pool1d, avg_pool2d, max_pool1d, max_pool2d
from monadl.dsl.ops.recurrent import gru_h, lstm_c, lstm_h, tree_lstm_c
from monadl.dsl.ops.reductions import argmax, argmin, logsumexp, max, mean, min, std, sum, var
from monadl.dsl.ops.selection import take_along_axis, take_rows, where
from monadl.dsl.ops.shape import concatenate, reshape, split, stack, transpose
from monadl.gradcheck import GradientMismatch, check_gradients
from monadl.nn.buffer import ArrayBuffer, Buffer, BufferState, GeneratorBuffer
from monadl.nn.dropout import Dropout
from monadl.nn.module import Module, buffers_of, parameter_count, summary, to_device, weights_of
from monadl.runtime.staging import stage_buffer, staged_data
from monadl.typeclasses.backend import Array, ShapeError

__version__ = "0.1.0"

__all__ = [
    # layers and weights
    "Array",
    "AnyArray",
    "AnyFloat",
    "AnyLayer",
    "ArrayLayer",
    "FloatLayer",
    "ArrayOperators",
    "FloatOperators",
    "ArrayWeight",
    "FloatWeight",
    "DeepLearning",
    "lift",
    "lift_array",
    "lift_float",
    # running and training a layer
    "predict",
    "predict_blocking",
    "train",
    "train_blocking",
    "compute_gradients",
    "apply_gradients",
    "is_training",
    "NoOptimizerError",
    "NonFiniteBufferError",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    # ops: elementwise
    "abs",
    "exp",
    "log",
    "sqrt",
    "maximum",
    "minimum",
    "add_n",
    # ops: activations
    "tanh",
    "sigmoid",
    "relu",
    "softplus",
    "gelu",
    "silu",
    "leaky_relu",
    "elu",
    "clip",
    "softmax",
    "log_softmax",
    # ops: reductions
    "sum",
    "mean",
    "max",
    "min",
    "logsumexp",
    "var",
    "std",
    "argmax",
    "argmin",
    # ops: shape
    "reshape",
    "transpose",
    "concatenate",
    "split",
    "stack",
    "flatten",
    "pad",
    "PadMode",
    # ops: selection
    "take_rows",
    "take_along_axis",
    "where",
    # ops: linear algebra
    "matmul",
    "dot",
    "linear",
    # ops: losses
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "huber_loss",
    "smooth_l1_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "Reduction",
    # ops: convolution and pooling
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    # ops: normalisation, attention, recurrent cells
    "layer_norm",
    "group_norm",
    "rms_norm",
    "batch_norm",
    "scaled_dot_product_attention",
    "lstm_c",
    "lstm_h",
    "tree_lstm_c",
    "gru_h",
    # optimizers, gradient transforms and learning-rate schedules
    "Optimizer",
    "SGD",
    "Momentum",
    "Adagrad",
    "RMSprop",
    "Adam",
    "AdamW",
    "GradientTransform",
    "Chain",
    "chain",
    "clip_by_global_norm",
    "clip_by_value",
    "global_norm",
    "LearningRate",
    "Schedule",
    "Constant",
    "CosineDecay",
    "LinearWarmup",
    "StepDecay",
    # modules and buffers
    "Module",
    "Dropout",
    "Buffer",
    "BufferState",
    "ArrayBuffer",
    "GeneratorBuffer",
    "weights_of",
    "buffers_of",
    "parameter_count",
    "summary",
    "to_device",
    "stage_buffer",
    "staged_data",
    # the monad and its execution
    "Do",
    "pure",
    "gather",
    "direct",
    "parallel",
    "batchable",
    "Executor",
    "default_executor",
    "set_default_executor",
    "gc_paused",
    # extending: custom ops and gradient checks; errors
    "custom_op",
    "CustomOp",
    "RunContext",
    "ShapeRuleError",
    "check_gradients",
    "GradientMismatch",
    "ShapeError",
    # data and checkpoints
    "DataLoader",
    "save",
    "load",
    "CheckpointError",
]

if compiled():  # mypyc keeps no docstrings and no annotated signatures: the build recorded them
    from monadl._compiled import docs as _docs
    from monadl._documented import restore as _restore

    _restore(globals(), _docs())
