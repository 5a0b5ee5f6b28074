"""FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` on shardkit's kernel: forward and fused
updates against ``torch.nn.EmbeddingBag`` tables stepped by the same rule (the spec), and against
FBGEMM itself (CPU build) in the peers venv."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit.fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops import (
    SplitTableBatchedEmbeddingBagsCodegen as OldPath,
)
from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    EmbeddingLocation,
    PoolingMode,
)
from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from tests.compat.peers import run_in_torchrec

SPECS = [
    (10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU),
    (7, 8, EmbeddingLocation.HOST, ComputeDevice.CPU),
]  # fmt: skip (FBGEMM: dim % 4 == 0)
FEATURES = [1, 0, 1]  # three features; two read table 1
B = 3


def _batch(seed: int, features: list[int] = FEATURES):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(features) * B,), generator=g)
    rows = [SPECS[t][0] for t in features for _ in range(B)]
    indices = torch.cat(
        [torch.randint(0, r, (int(n),), generator=g) for r, n in zip(rows, lengths)]
    )
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return indices, offsets, torch.rand(indices.numel(), generator=g)


def _reference(tbe, indices, offsets, weights, mode):
    """Per feature: torch.nn.EmbeddingBag over its table's current weights. [B, sum dims]"""
    tables = [torch.nn.EmbeddingBag.from_pretrained(w.clone(), freeze=False, mode=mode)
              for w in tbe.split_embedding_weights()]  # fmt: skip
    outs = []
    for f, t in enumerate(FEATURES):
        lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
        local = offsets[f * B : (f + 1) * B] - lo
        w = None if weights is None else weights[lo:hi]
        outs.append(tables[t](indices[lo:hi], local, per_sample_weights=w))
    return torch.cat(outs, dim=1), tables


@pytest.mark.parametrize("weighted", [False, True])
def test_forward_and_sgd_steps_match_embedding_bags(weighted):
    torch.manual_seed(0)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(SPECS, FEATURES, learning_rate=0.3)
    for step in range(3):
        indices, offsets, weights = _batch(step)
        weights = weights if weighted else None
        expected, tables = _reference(tbe, indices, offsets, weights, "sum")
        out = tbe(indices, offsets, weights)
        torch.testing.assert_close(out, expected)
        loss = (out * torch.arange(out.shape[1])).sum()
        loss.backward()  # SGD fused: the tables step here
        (expected * torch.arange(out.shape[1])).sum().backward()
        for got, table in zip(tbe.split_embedding_weights(), tables):
            torch.testing.assert_close(got, table.weight.detach() - 0.3 * table.weight.grad)


def test_mean_pooling_rowwise_adagrad_and_learning_rate():
    tbe = OldPath(SPECS, FEATURES, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                  learning_rate=0.1, pooling_mode=PoolingMode.MEAN, eps=1e-6)  # fmt: skip
    indices, offsets, _ = _batch(4)
    expected, tables = _reference(tbe, indices, offsets, None, "mean")
    out = tbe(indices, offsets)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for got, table in zip(tbe.split_embedding_weights(), tables):
        grad = table.weight.grad
        acc = grad.pow(2).mean(1, keepdim=True)  # one accumulator per row, from 0
        want = table.weight.detach() - 0.1 * grad / (acc.sqrt() + 1e-6)
        torch.testing.assert_close(got, want)
    tbe.set_learning_rate(0.5)
    assert tbe.get_learning_rate() == 0.5
    with torch.no_grad():
        tbe.split_embedding_weights()[0].fill_(1.0)  # live: FBGEMM users initialize so
    assert tbe(indices, offsets)[:, 8:12].unique().tolist() in ([0.0, 1.0], [1.0])  # feature 1


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"cache_load_factor": 0.5}, ValueError, r"cache_load_factor=0.5: no cache in shardkit"),
        ({"use_cpu": True}, TypeError, r"got FBGEMM argument\(s\) \['use_cpu'\] that shardkit "
         r"does not take"),
        ({"weight_decay": 0.1}, ValueError, r"weight_decay=0.1: FBGEMM's EXACT_SGD applies no "
         r"weight decay without weight_decay_mode"),
        ({"pooling_mode": PoolingMode.NONE}, ValueError, r"this module pools \(SUM or MEAN\)"),
        ({"weights_precision": SparseType.INT8}, ValueError, r"training tables are FP32, FP16 or"),
    ],
)  # fmt: skip
def test_refusals_name_the_argument(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        SplitTableBatchedEmbeddingBagsCodegen(SPECS, **kwargs)


def test_uvm_and_bad_offsets_are_refused():
    with pytest.raises(ValueError, match=r"table 0: EmbeddingLocation.MANAGED \(UVM or its cache"):
        SplitTableBatchedEmbeddingBagsCodegen([(4, 4, EmbeddingLocation.MANAGED, ComputeDevice.CPU)])  # fmt: skip
    tbe = SplitTableBatchedEmbeddingBagsCodegen(SPECS)
    with pytest.raises(ValueError, match=r"offsets must be 1-D with T \* B \+ 1 entries for T = 2"):
        tbe(torch.tensor([1, 2]), torch.tensor([0, 1, 2, 2]))  # 3 bags for 2 features


_FBGEMM = """
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
specs = [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in inputs["specs"]]
for name, kwargs in inputs["cases"].items():
    kwargs = dict(kwargs, optimizer=EmbOptimType[kwargs["optimizer"]],
                  pooling_mode=PoolingMode[kwargs["pooling_mode"]])
    weighted = kwargs.pop("weighted")
    tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, inputs["features"], **kwargs)
    for w, start in zip(tbe.split_embedding_weights(), inputs["start"]):
        w.copy_(start)
    outs = []
    for indices, offsets, weights in inputs["batches"]:
        out = tbe(indices, offsets, weights if weighted else None)
        (out * torch.arange(out.shape[1])).sum().backward()
        outs.append(out.detach())
    outputs[name] = (outs, [w.clone() for w in tbe.split_embedding_weights()])
"""
# FBGEMM's CPU build steps SGD and row-wise Adagrad; its EXACT_ADAGRAD, and row-wise Adagrad on a
# table that two features read, fail on CPU ("num of rows processed by adagrad: 0 does not match
# c_block size"): one feature per table here. Its CPU backward of weighted MEAN bags leaves out
# the 1/len its forward divides by (gradient w * g, not w * g / len; shardkit's is the latter, the
# derivative of the forward): MEAN is compared unweighted.
OWN_TABLES = [0, 1]
CASES = {
    "sgd_sum": {"optimizer": "EXACT_SGD", "learning_rate": 0.2, "pooling_mode": "SUM",
                "weighted": True},
    "rowwise_sum": {"optimizer": "EXACT_ROWWISE_ADAGRAD", "learning_rate": 0.1, "eps": 1e-6,
                    "pooling_mode": "SUM", "weighted": True},
    "rowwise_mean": {"optimizer": "EXACT_ROWWISE_ADAGRAD", "learning_rate": 0.1, "eps": 1e-6,
                     "pooling_mode": "MEAN", "weighted": False},
}  # fmt: skip


def test_the_same_steps_as_fbgemm(tmp_path):
    start = [torch.randn(r, d, generator=torch.Generator().manual_seed(r)) for r, d, *_ in SPECS]
    batches = [_batch(s, OWN_TABLES) for s in range(3)]
    batches = [(i, o, w if s != 1 else None) for s, (i, o, w) in enumerate(batches)]
    theirs = run_in_torchrec(_FBGEMM, {"specs": [s[:2] for s in SPECS], "features": OWN_TABLES,
                                       "cases": CASES, "start": start, "batches": batches}, tmp_path)  # fmt: skip
    for name, kwargs in CASES.items():
        kwargs = dict(kwargs, optimizer=EmbOptimType[kwargs["optimizer"]],
                      pooling_mode=PoolingMode[kwargs["pooling_mode"]])  # fmt: skip
        weighted = kwargs.pop("weighted")
        tbe = SplitTableBatchedEmbeddingBagsCodegen(SPECS, OWN_TABLES, **kwargs)
        with torch.no_grad():
            for w, s in zip(tbe.split_embedding_weights(), start):
                w.copy_(s)
        for (indices, offsets, weights), expected in zip(batches, theirs[name][0]):
            out = tbe(indices, offsets, weights if weighted else None)
            torch.testing.assert_close(out.detach(), expected, msg=name)
            (out * torch.arange(out.shape[1])).sum().backward()
        for got, expected in zip(tbe.split_embedding_weights(), theirs[name][1]):
            torch.testing.assert_close(got, expected, msg=name)


def test_dense_tables_leave_gradients_for_a_torch_optimizer():
    from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    torch.manual_seed(0)
    tbe = DenseTableBatchedEmbeddingBagsCodegen([s[:2] for s in SPECS], FEATURES, use_cpu=True)
    optimizer = torch.optim.Adam(tbe.parameters(), lr=0.1)
    for step in range(2):
        indices, offsets, weights = _batch(10 + step)
        expected, tables = _reference(tbe, indices, offsets, weights, "sum")
        reference = torch.optim.Adam([t.weight for t in tables], lr=0.1)
        reference.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # the moments so far
        out = tbe(indices, offsets, weights)
        torch.testing.assert_close(out, expected)
        optimizer.zero_grad()
        (out * torch.arange(out.shape[1])).sum().backward()
        (expected * torch.arange(out.shape[1])).sum().backward()
        grads = [p.grad for p in tbe.parameters()]
        torch.testing.assert_close(grads, [t.weight.grad for t in tables])
        optimizer.step()
        reference.step()
        torch.testing.assert_close(
            tbe.split_embedding_weights(), [t.weight.detach() for t in tables]
        )
    with pytest.raises(ValueError, match=r"use_mtia=True: MTIA devices are not in shardkit"):
        DenseTableBatchedEmbeddingBagsCodegen([(4, 4)], use_mtia=True)
