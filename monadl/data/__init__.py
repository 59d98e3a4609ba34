"""Data sets for monadl's examples and benchmarks, and :class:`DataLoader`, which batches any data
set (arrays, or a sequence of examples) for training, epoch after epoch (see
:mod:`monadl.data.loader`).

``cifar100``: the official binary CIFAR-100 release (``train.bin``, ``test.bin`` or the
``cifar-100-binary.tar.gz`` archive), validated and read a batch at a time, batched by coarse class
for the column model; and a learnable synthetic stand-in written in the same format, used when no data
path is given. ``open_cifar100(path)`` (``cifar100.open_dataset``) opens either; ``describe()`` says
which one a run used. A path that is neither a regular file nor a directory (a FIFO, a device) is
refused with ``NotARegularFileError``, by what it is.
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
from monadl.data.files import NotARegularFileError
from monadl.data.loader import DataLoader, Examples, default_collate

__all__ = [
    # batching (monadl.data.loader)
    "DataLoader",
    "Examples",
    "default_collate",
    # CIFAR-100
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
    "NotARegularFileError",
    "Split",
    "StrPath",
    "default_cache_dir",
    "extract_cifar100",
    "open_cifar100",
    "synthetic_cifar100",
    "write_synthetic_cifar100",
]
