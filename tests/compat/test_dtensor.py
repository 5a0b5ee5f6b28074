"""`is_dtensor` answers without importing DTensor, as ``isinstance`` does once it is imported,
and ``torch.compile`` traces it (the ``pt2_grid`` tier) ([Note: DTensor on demand]); that
importing shardkit.fsdp, .checkpoint, .train and .cli leaves DTensor unimported is checked in a fresh process by
tests/test_public_api.py."""

from __future__ import annotations

import sys

import pytest
import torch

from shardkit.compat import is_dtensor


class _FakeDTensorModule:
    """``torch.distributed.tensor`` as `is_dtensor` sees it: a module with a DTensor class."""

    class DTensor(torch.Tensor):
        pass


def test_no_value_is_a_dtensor_while_dtensor_is_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.distributed.tensor", raising=False)
    assert not is_dtensor(torch.ones(2))
    assert "torch.distributed.tensor" not in sys.modules  # asking imported nothing


def test_once_imported_it_is_isinstance(monkeypatch):
    fake = _FakeDTensorModule()
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", fake)
    dtensor = torch.ones(2).as_subclass(fake.DTensor)
    assert is_dtensor(dtensor)
    assert is_dtensor(torch.nn.Parameter(dtensor))  # fully_shard registers them so
    assert not is_dtensor(torch.ones(2))
    assert not is_dtensor(None)


@pytest.mark.pt2_grid  # (a compile: seconds on the 2-core CI machine)
def test_compile_traces_it_whole():
    import torch.distributed.tensor

    def local_or_doubled(x: torch.Tensor) -> torch.Tensor:
        return x if is_dtensor(x) else x * 2

    compiled = torch.compile(local_or_doubled, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 2.0))
