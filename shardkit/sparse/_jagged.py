"""`JaggedTensor`: one feature's bags of ids for a batch, as values plus lengths or offsets."""

from __future__ import annotations

import torch

from shardkit.sparse._checks import check_lengths_and_offsets, check_values_and_weights
from shardkit.sparse._format import describe, jagged_tensor_string
from shardkit.sparse._segments import complete_cumsum, to_padded
from shardkit.sparse._validate import check_bags, check_lengths_match_offsets, check_total

__all__ = ["JaggedTensor"]

_OWNER = "JaggedTensor"


def _move(
    tensor: torch.Tensor | None, device: torch.device, non_blocking: bool
) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device, non_blocking=non_blocking)


class JaggedTensor:
    """One feature's bags for a batch: a *jagged* dimension whose rows have different lengths.

    Worked example, the "product" feature of a batch of 3 examples::

        example   product ids
        0         [101, 202]
        1         []
        2         [303]

        values  = [101, 202, 303]   # [N]: every id, bag after bag
        lengths = [2, 0, 1]         # [B]: ids in each bag
        offsets = [0, 2, 2, 3]      # [B + 1]: bag b is values[offsets[b] : offsets[b + 1]]

    Give ``lengths`` or ``offsets`` (or both); the other is derived when first asked for and
    cached. ``values`` may have trailing dimensions (``[N, D]``: one embedding per id, as an
    `EmbeddingCollection` returns). The constructor checks only what is free (ranks, dtypes,
    sizes); `validate` checks the data.

    Args:
        values: ``[N, *]`` ids (or per-id rows).
        weights: ``[N]`` float, one weight per id, or None.
        lengths: ``[B]`` integer number of ids per bag.
        offsets: ``[B + 1]`` integer start of each bag in ``values``, then ``N``.
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> None:
        check_values_and_weights(_OWNER, values, weights, values_dim=None)
        lengths, offsets = check_lengths_and_offsets(_OWNER, lengths, offsets)
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets

    # -- constructors ------------------------------------------------------------------------

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> JaggedTensor:
        """A JaggedTensor of no bags (empty values, lengths and offsets)."""
        weights = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return JaggedTensor(
            values=torch.empty(0, dtype=values_dtype, device=device),
            weights=weights,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            offsets=torch.empty(0, dtype=lengths_dtype, device=device),
        )

    @staticmethod
    def empty_like(jt: JaggedTensor, device: torch.device | None = None) -> JaggedTensor:
        """No bags with ``jt``'s dtypes; with ``device``, uninitialised tensors of its shapes."""
        if device is None:
            here, weights = jt.device(), jt.weights_or_none()
            return JaggedTensor(
                values=torch.empty(0, dtype=jt.values().dtype, device=here),
                weights=None
                if weights is None
                else torch.empty(0, dtype=weights.dtype, device=here),
                lengths=torch.empty(0, dtype=jt.lengths().dtype, device=here),
            )

        def empty(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else torch.empty_like(t, device=device)

        return JaggedTensor(
            values=torch.empty_like(jt.values(), device=device),
            weights=empty(jt.weights_or_none()),
            lengths=empty(jt.lengths_or_none()),
            offsets=empty(jt.offsets_or_none()),
        )

    @staticmethod
    def from_dense_lengths(
        values: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None
    ) -> JaggedTensor:
        """Keep the first ``lengths[b]`` entries of row ``b`` of a padded ``[B, L, *]`` tensor.

        Args:
            values: ``[B, L, *]`` padded rows.
            lengths: ``[B]`` how many entries of each row are real.
            weights: ``[B, L]`` padded weights, or None.
        """
        if values.dim() < 2 or lengths.dim() != 1 or lengths.numel() != values.size(0):
            raise ValueError(
                f"{_OWNER}.from_dense_lengths: values have shape {tuple(values.shape)} and "
                f"lengths {tuple(lengths.shape)}; values must be [B, L, *] padded rows and "
                "lengths [B], one entry per row"
            )
        positions = torch.arange(values.size(1), device=values.device)
        mask = positions.expand(values.size(0), -1) < lengths.unsqueeze(-1)  # [B, L]
        return JaggedTensor(
            values=values[mask],
            weights=None if weights is None else weights[mask],
            lengths=lengths,
        )

    @staticmethod
    def from_dense(
        values: list[torch.Tensor], weights: list[torch.Tensor] | None = None
    ) -> JaggedTensor:
        """One bag per tensor of ``values`` (lengths are int32, as in TorchRec).

        Example: ``from_dense([tensor([1.0]), tensor([]), tensor([7.0, 8.0])])`` has
        ``values() == [1.0, 7.0, 8.0]`` and ``lengths() == [1, 0, 2]``.
        """
        if weights is not None and len(weights) != len(values):
            raise ValueError(
                f"{_OWNER}.from_dense: {len(values)} value tensors but {len(weights)} weight "
                "tensors; give one weight tensor per bag, the same size as its values"
            )
        if not values:
            return JaggedTensor.empty(is_weighted=weights is not None)
        values_tensor = torch.cat(values, dim=0)
        lengths = torch.tensor(
            [v.size(0) for v in values], dtype=torch.int32, device=values_tensor.device
        )
        weights_tensor = None if weights is None else torch.cat(weights, dim=0)
        return JaggedTensor(values=values_tensor, weights=weights_tensor, lengths=lengths)

    # -- accessors ---------------------------------------------------------------------------

    def values(self) -> torch.Tensor:
        """``[N, *]`` all ids, bag after bag."""
        return self._values

    def weights(self) -> torch.Tensor:
        """``[N]`` the weights; raises if this JaggedTensor has none."""
        if self._weights is None:
            raise ValueError(
                f"{_OWNER} has no weights; build it with weights=..., or call weights_or_none()"
            )
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        """``[B]`` ids per bag (derived from offsets the first time if needed, then cached)."""
        if self._lengths is None:
            assert self._offsets is not None
            self._lengths = torch.diff(self._offsets)
        return self._lengths

    def lengths_or_none(self) -> torch.Tensor | None:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """``[B + 1]`` bag starts then ``N`` (derived from lengths if needed, then cached)."""
        if self._offsets is None:
            assert self._lengths is not None
            self._offsets = complete_cumsum(self._lengths)
        return self._offsets

    def offsets_or_none(self) -> torch.Tensor | None:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    # -- dense views -------------------------------------------------------------------------

    def to_dense(self) -> list[torch.Tensor]:
        """One tensor per bag (views of ``values``; one device->host sync for the lengths)."""
        return list(torch.split(self._values, self.lengths().tolist()))

    def to_dense_weights(self) -> list[torch.Tensor] | None:
        """One weight tensor per bag, or None if unweighted."""
        if self._weights is None:
            return None
        return list(torch.split(self._weights, self.lengths().tolist()))

    def to_padded_dense(
        self, desired_length: int | None = None, padding_value: float = 0.0
    ) -> torch.Tensor:
        """``[B, L, *]``: bag ``b`` in row ``b``, padded with ``padding_value``.

        ``L`` is ``desired_length`` (longer bags are cut to their first ``L`` ids) or, if None,
        the longest bag (one device->host sync).
        """
        return self._padded(self._values, desired_length, padding_value)

    def to_padded_dense_weights(
        self, desired_length: int | None = None, padding_value: float = 0.0
    ) -> torch.Tensor | None:
        """Like `to_padded_dense` for the weights ``[B, L]``; None if unweighted."""
        if self._weights is None:
            return None
        return self._padded(self._weights, desired_length, padding_value)

    def _padded(
        self, data: torch.Tensor, desired_length: int | None, padding_value: float
    ) -> torch.Tensor:
        lengths = self.lengths()
        if desired_length is None:
            width = int(lengths.max()) if lengths.numel() else 0
        elif desired_length < 0:
            raise ValueError(
                f"{_OWNER}.to_padded_dense: desired_length is {desired_length}; it must be >= 0 "
                "(or None for the longest bag)"
            )
        else:
            width = desired_length
        return to_padded(data, lengths, self.offsets(), width, padding_value)

    # -- devices and streams -----------------------------------------------------------------

    def to(self, device: torch.device, non_blocking: bool = False) -> JaggedTensor:
        """A copy on ``device`` (lengths/offsets move only if already computed)."""
        return JaggedTensor(
            values=self._values.to(device, non_blocking=non_blocking),
            weights=_move(self._weights, device, non_blocking),
            lengths=_move(self._lengths, device, non_blocking),
            offsets=_move(self._offsets, device, non_blocking),
        )

    def pin_memory(self) -> JaggedTensor:
        """A copy in pinned host memory (for fast asynchronous copies to a GPU)."""

        def pin(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.pin_memory()

        return JaggedTensor(self._values.pin_memory(), pin(self._weights), pin(self._lengths),
                            pin(self._offsets))  # fmt: skip

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use by ``stream`` (see `torch.Tensor.record_stream`)."""
        for tensor in self._tensors():
            if tensor is not None:
                tensor.record_stream(stream)

    def _tensors(self) -> list[torch.Tensor | None]:
        return [self._values, self._weights, self._lengths, self._offsets]

    # -- checks and printing -----------------------------------------------------------------

    def validate(self) -> JaggedTensor:
        """Check the data: lengths >= 0, offsets 0-based and non-decreasing, lengths and offsets
        agree, and the bags cover ``values`` exactly. Syncs with the device; returns ``self``."""
        owner = f"{_OWNER}.validate"
        check_bags(owner, self._lengths, self._offsets, lambda bag: "")
        check_lengths_match_offsets(owner, self._lengths, self._offsets, lambda bag: "")
        check_total(owner, self._lengths, self._offsets, self._values.size(0))
        return self

    def __str__(self) -> str:
        return jagged_tensor_string(self._values, self._weights, self.offsets())

    def __repr__(self) -> str:
        tensors = describe(values=self._values, weights=self._weights, lengths=self._lengths,
                           offsets=self._offsets)  # fmt: skip
        return f"{_OWNER}({tensors})"
