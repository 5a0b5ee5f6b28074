"""Counter-based randomness: a 64-bit mixing hash (splitmix64's finaliser) on Python ints and on
int64 tensors, bit for bit the same.

[Note: counter-based randomness]
The synthetic data set and the per-epoch shuffle seeds must not depend on how many examples were
drawn before, nor on the world size, nor on torch's generator algorithms (which may change between
releases). So every random quantity is ``mix(seed, example, field, ...)``: a pure function of its
coordinates, computed vectorised over a whole batch with int64 arithmetic (which wraps modulo
2**64 in torch, as two's complement). Right shifts are made logical with a mask, because torch's
``>>`` on int64 is arithmetic.
"""

from __future__ import annotations

import torch

__all__ = ["mix_int", "mix_tensor", "uniform"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as ``value``."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _finalise_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def _step_int(z: int, part: int) -> int:
    return _finalise_int((z + _GOLDEN + (part & _MASK64)) & _MASK64)


def mix_int(*parts: int) -> int:
    """Hash non-negative ints to a uniformly spread 64-bit int (in ``[0, 2**64)``)."""
    z = 0
    for part in parts:
        z = _step_int(z, part)
    return z


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    shifted = x >> bits
    return shifted.bitwise_and_((1 << (64 - bits)) - 1)


def _finalise_tensor(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, in place on ``z`` (a tensor this module made)."""
    z ^= _shift_right(z, 30)
    z *= _signed(_M1)
    z ^= _shift_right(z, 27)
    z *= _signed(_M2)
    z ^= _shift_right(z, 31)
    return z


def mix_tensor(*parts: int | torch.Tensor) -> torch.Tensor:
    """`mix_int` elementwise over int64 tensors (broadcast), as int64 holding the same bits."""
    folded = 0
    while parts and isinstance(parts[0], int):  # leading constants: fold them on the host
        folded = _step_int(folded, parts[0])
        parts = parts[1:]
    z = torch.tensor(_signed(folded), dtype=torch.int64)
    for part in parts:
        if isinstance(part, int):
            part = torch.tensor(_signed(part), dtype=torch.int64)
        z = _finalise_tensor(z + (_signed(_GOLDEN) + part))
    return z


def uniform(*parts: int | torch.Tensor) -> torch.Tensor:
    """Floats in ``[0, 1)`` (float64, 53 random bits) from `mix_tensor` of ``parts``."""
    return _shift_right(mix_tensor(*parts), 11).to(torch.float64).mul_(1.0 / (1 << 53))
