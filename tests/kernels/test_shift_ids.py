"""The ids' shift to rows of a stack of tables: the compiled operator equals the eager loop of
`kernel_input` (its spec). See [Note: the ids' shift in one pass] in csrc/buckets.cpp."""

from __future__ import annotations

import pytest
import torch

from shardkit import kernels
from shardkit.modules import kernel_input


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_compiled_shift_equals_the_eager_loop(monkeypatch, dtype):
    g = torch.Generator().manual_seed(3)
    counts = [5, 0, 7, 3, 4]  # an empty segment
    bases = [0, 11, 2**33, 0, 7]  # a base past int32, unshifted segments
    ids = torch.randint(0, 1000, (sum(counts) + 2,), generator=g, dtype=dtype)  # 2 past them
    lengths = torch.tensor([4, 0, 9, 8])
    with kernels.use_kernel("eager"):
        want, want_offsets = kernel_input(ids, lengths, bases, counts)
    calls = []

    def counted(*args):
        calls.append(args)
        return shift_ids(*args)

    shift_ids = kernels.shift_ids
    monkeypatch.setattr(kernels, "shift_ids", counted)
    with kernels.use_kernel("compiled"):
        got, offsets = kernel_input(ids, lengths, bases, counts)
    assert len(calls) == 1, "the compiled path did not run"
    assert got.dtype == torch.int64 and got.data_ptr() != ids.data_ptr()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(offsets, want_offsets)


def test_compiled_shift_refuses_segments_it_cannot_read():
    ids = torch.arange(6)
    with kernels.use_kernel("compiled"):
        with pytest.raises(RuntimeError, match="shift_ids: one base per segment: 2 bases for 1"):
            kernels.shift_ids(ids, [1, 2], [6])
        with pytest.raises(
            RuntimeError, match="shift_ids: the segments hold 7 ids, more than the 6"
        ):
            kernels.shift_ids(ids, [1, 2], [3, 4])
        with pytest.raises(RuntimeError, match="shift_ids: ids must be 1-D int64 or int32"):
            kernels.shift_ids(ids.float(), [1], [6])
