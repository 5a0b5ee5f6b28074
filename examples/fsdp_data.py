"""Fashion-MNIST from the vendored idx files, as tensors: the examples' stand-in for
``torchvision.datasets.MNIST`` (same format, no download, no torchvision).

``fashion_mnist("train")`` is images 0-7999 of the test split, ``fashion_mnist("test")`` images
8000-9999, each ``[N, 1, 28, 28]`` float32 normalised like ``transforms.ToTensor()`` followed by
``transforms.Normalize(mean, std)``, with int64 labels ``[N]``. The environment variable
``SHARDKIT_FMNIST_LIMIT=N`` keeps the first N images of each split (for quick runs and tests).
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

DATA = Path(__file__).resolve().parents[1] / "data" / "fashion-mnist"
NUM_TRAIN = 8000
# Fashion-MNIST's pixel mean and standard deviation (MNIST's are 0.1307 and 0.3081)
MEAN, STD = 0.2860, 0.3530


def read_idx(path: Path) -> torch.Tensor:
    """An idx file (MNIST's format: big-endian magic, dims, then uint8 data) as a uint8 tensor."""
    data = gzip.decompress(path.read_bytes())
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an idx file of uint8 (header {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    values = torch.frombuffer(bytearray(data[4 + 4 * ndim :]), dtype=torch.uint8)
    return values.reshape(dims)


def fashion_mnist(split: str, root: Path = DATA) -> TensorDataset:
    """``split`` is "train" or "test"; see the module docstring."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images = read_idx(root / "t10k-images-idx3-ubyte.gz")  # [10000, 28, 28]
    labels = read_idx(root / "t10k-labels-idx1-ubyte.gz").long()  # [10000]
    part = slice(0, NUM_TRAIN) if split == "train" else slice(NUM_TRAIN, None)
    images, labels = images[part], labels[part]
    limit = int(os.environ.get("SHARDKIT_FMNIST_LIMIT", "0"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    pixels = images.float().div_(255).sub_(MEAN).div_(STD).unsqueeze(1)  # [N, 1, 28, 28]
    return TensorDataset(pixels, labels)
