"""The batched kernel against torch's own embedding ops: outputs, gradients, fused updates.

Inputs have duplicate ids within and across bags and empty bags; `_CHUNK_BYTES` is shrunk so
that backward runs over several chunks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardkit.modules import _kernel
from shardkit.modules._kernel import BatchedTables, lookup
from shardkit.optim import EmbOptimType, FusedOptimizerConfig, RowOptimizer
from tests.modules.reference import is_sparse_reference, reference_optimizer

ROWS, DIM = 30, 4
IDS = torch.tensor([1, 1, 7, 29, 0, 1, 7, 7, 3, 12, 12, 5])
OFFSETS = torch.tensor([0, 3, 3, 6, 6, 10, 12])  # bags: [1,1,7] [] [29,0,1] [] [7,7,3,12] [12,5]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(_kernel, "_CHUNK_BYTES", 2 * 4 * DIM)
    monkeypatch.setattr(_kernel, "_MIN_CHUNK_ROWS", 2)  # 2 unique rows per chunk


def _stack(weight: torch.Tensor, optimizer=None, splits=(0, 10, ROWS)):
    tables = BatchedTables(weight.clone(), list(splits), optimizer)
    params = [torch.nn.Parameter(v) for v in tables.table_views()]
    return tables, params


@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_forward_and_dense_gradients(weighted):
    torch.manual_seed(0)
    weight = torch.randn(ROWS, DIM)
    psw = torch.rand(IDS.numel(), requires_grad=True) if weighted else None
    tables, params = _stack(weight)
    out = lookup(tables, IDS, OFFSETS, psw, params)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)

    ref_weight = weight.clone().requires_grad_()
    ref_psw = psw.detach().clone().requires_grad_() if weighted else None
    ref = F.embedding_bag(
        IDS, ref_weight, OFFSETS, mode="sum", per_sample_weights=ref_psw, include_last_offset=True
    )
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.cat([p.grad for p in params]), ref_weight.grad)
    if weighted:
        torch.testing.assert_close(psw.grad, ref_psw.grad)


def test_sequence_forward_and_dense_gradients():
    torch.manual_seed(1)
    weight = torch.randn(ROWS, DIM)
    tables, params = _stack(weight)
    out = lookup(tables, IDS, None, None, params)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_weight = weight.clone().requires_grad_()
    ref = F.embedding(IDS, ref_weight)
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.cat([p.grad for p in params]), ref_weight.grad)


def _reference(kind: EmbOptimType, weight: torch.Tensor, lr: float):
    sparse = is_sparse_reference(kind)
    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=sparse, include_last_offset=True)
    bag.weight.data.copy_(weight)
    return bag, reference_optimizer(kind, bag.parameters(), lr)


@pytest.mark.parametrize("kind", list(EmbOptimType))
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_update_matches_torch_optimizer(kind, weighted):
    torch.manual_seed(2)
    weight = torch.randn(ROWS, DIM)
    config = FusedOptimizerConfig(kind, learning_rate=0.05, eps=1e-8)
    tables, params = _stack(weight, RowOptimizer(config, ROWS, DIM, torch.device("cpu")))
    bag, optimizer = _reference(kind, weight, 0.05)
    for step in range(4):
        psw = torch.rand(IDS.numel()) if weighted else None
        grad_out = torch.randn(OFFSETS.numel() - 1, DIM)
        lookup(tables, IDS, OFFSETS, psw, params).backward(grad_out)
        optimizer.zero_grad()
        bag(IDS, OFFSETS, per_sample_weights=psw).backward(grad_out)
        optimizer.step()
        torch.testing.assert_close(
            tables.weight, bag.weight.detach(), atol=1e-5, rtol=1e-5, msg=f"step {step}"
        )
    assert all(p.grad is None for p in params), "fused tables never hold a gradient"


def test_weight_decay_is_l2_on_touched_rows():
    torch.manual_seed(3)
    weight = torch.randn(ROWS, DIM)
    config = FusedOptimizerConfig(EmbOptimType.EXACT_SGD, learning_rate=0.1, weight_decay=0.5)
    tables, params = _stack(weight, RowOptimizer(config, ROWS, DIM, torch.device("cpu")))
    grad_out = torch.randn(OFFSETS.numel() - 1, DIM)
    lookup(tables, IDS, OFFSETS, None, params).backward(grad_out)
    dense = torch.zeros(ROWS, DIM)
    bags = torch.repeat_interleave(torch.arange(OFFSETS.numel() - 1), OFFSETS.diff())
    dense.index_add_(0, IDS, grad_out[bags])
    touched = torch.zeros(ROWS, dtype=torch.bool)
    touched[IDS] = True
    expected = weight.clone()
    expected[touched] -= 0.1 * (dense[touched] + 0.5 * weight[touched])
    torch.testing.assert_close(tables.weight, expected)


def test_empty_batch_is_a_no_op():
    weight = torch.randn(ROWS, DIM)
    config = FusedOptimizerConfig(EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1)
    tables, params = _stack(weight, RowOptimizer(config, ROWS, DIM, torch.device("cpu")))
    ids = torch.empty(0, dtype=torch.int64)
    offsets = torch.zeros(4, dtype=torch.int64)
    out = lookup(tables, ids, offsets, None, params)
    assert out.shape == (3, DIM) and not out.any()
    out.sum().backward()
    torch.testing.assert_close(tables.weight, weight)
