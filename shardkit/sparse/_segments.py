"""Vectorised segment arithmetic shared by the jagged types; none of it loops over the batch.

A *segment* is a run of consecutive entries: the bags of one key inside ``lengths``, or the ids of
one key inside ``values``. Segment boundaries are Python lists (host metadata, one entry per key),
so building an index from them costs no device->host sync.
"""

from __future__ import annotations

import torch

__all__ = [
    "boundary_diffs",
    "complete_cumsum",
    "cumsum_list",
    "gather_segments",
    "host_list_to",
    "to_padded",
]


def cumsum_list(numbers: list[int]) -> list[int]:
    """``[0, n0, n0 + n1, ...]``: the boundaries of segments of the given sizes."""
    out = [0]
    for number in numbers:
        out.append(out[-1] + number)
    return out


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """Lengths ``[N]`` -> offsets ``[N + 1]`` starting at 0, in the dtype of ``lengths``."""
    offsets = lengths.new_zeros(lengths.numel() + 1)
    offsets[1:] = torch.cumsum(lengths, 0, dtype=lengths.dtype)
    return offsets


def boundary_diffs(offsets: torch.Tensor, boundaries: list[int]) -> list[int]:
    """``offsets[b[i + 1]] - offsets[b[i]]`` for consecutive boundaries: one device->host sync.

    With ``offsets`` the complete cumsum of ``lengths`` and ``boundaries`` the first bag of each
    key, this is the number of ids of each key (``length_per_key``).
    """
    if len(boundaries) < 2:
        return []
    index = host_list_to(boundaries, offsets.device)
    return torch.diff(offsets.index_select(0, index)).tolist()


def host_list_to(values: list[int], device: torch.device) -> torch.Tensor:
    """A short host list as an int64 tensor on ``device``. ``non_blocking``: on a GPU the copy
    then does not wait for the kernels already queued (a blocking one would wait for all of
    them); the list is staged before the call returns, so reusing it is safe."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def gather_segments(starts: list[int], sizes: list[int], device: torch.device) -> torch.Tensor:
    """The index that concatenates ``x[starts[i] : starts[i] + sizes[i]]`` for every ``i``.

    Segments may repeat or come in any order. Returns an int64 tensor ``[sum(sizes)]`` for
    ``index_select``; its size is known on the host, so no sync.
    """
    total = sum(sizes)
    out_starts = cumsum_list(sizes)[:-1]
    shift = [start - out for start, out in zip(starts, out_starts)]
    shift_t = host_list_to(shift, device)
    sizes_t = host_list_to(sizes, device)
    position = torch.arange(total, dtype=torch.int64, device=device)
    return position + torch.repeat_interleave(shift_t, sizes_t, output_size=total)


def to_padded(
    values: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    width: int,
    padding_value: float,
) -> torch.Tensor:
    """Bags ``[N, *]`` -> ``[B, width, *]``: bag ``b`` in row ``b``, cut or padded to ``width``.

    Ids past ``width`` go to a spare column that is dropped at the end, so no boolean mask (and
    no sync) is needed to leave them out.
    """
    num_bags = lengths.numel()
    out = values.new_full((num_bags, width + 1, *values.shape[1:]), padding_value)
    total = values.size(0)
    if total > 0 and num_bags > 0:
        rows = torch.arange(num_bags, device=values.device)
        row = torch.repeat_interleave(rows, lengths.long(), output_size=total)  # [N]
        col = torch.arange(total, device=values.device) - offsets.index_select(0, row)
        out[row, col.clamp(max=width)] = values
    return out[:, :width].contiguous()
