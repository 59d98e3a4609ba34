"""Data sets for monadl's examples and benchmarks.

``cifar100``: the official binary CIFAR-100 release (``train.bin``, ``test.bin`` or the
``cifar-100-binary.tar.gz`` archive), memory-mapped and validated, batched by coarse class for the
column model; and a learnable synthetic stand-in written in the same format, used when no data path
is given. ``open_cifar100(path)`` (``cifar100.open_dataset``) opens either; ``describe()`` says which
one a run used.
"""

from monadl.data.cifar100 import (
    COARSE_TO_FINE,
    FINE_PER_COARSE,
    FINE_TO_COARSE,
    FINE_TO_LOCAL,
    IMAGE_BYTES,
    N_COARSE,
    N_FINE,
    RECORD_BYTES,
    Batch,
    Cifar100,
    CifarFormatError,
    Split,
    StrPath,
    default_cache_dir,
    extract_cifar100,
    synthetic_cifar100,
    write_synthetic_cifar100,
)
from monadl.data.cifar100 import (
    open_dataset as open_cifar100,
)

__all__ = [
    "COARSE_TO_FINE",
    "FINE_PER_COARSE",
    "FINE_TO_COARSE",
    "FINE_TO_LOCAL",
    "IMAGE_BYTES",
    "N_COARSE",
    "N_FINE",
    "RECORD_BYTES",
    "Batch",
    "Cifar100",
    "CifarFormatError",
    "Split",
    "StrPath",
    "default_cache_dir",
    "extract_cifar100",
    "open_cifar100",
    "synthetic_cifar100",
    "write_synthetic_cifar100",
]
