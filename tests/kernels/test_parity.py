"""The compiled kernel against the eager one (the spec), step by step.

Three tables of one dim stacked in one buffer; bags with duplicate ids inside a bag and across
bags, empty bags, batch size 1; SUM and MEAN (MEAN is per-sample weights 1 / length, as the
collections fold it in), weighted and unweighted, int32 and int64 ids, fp32/fp16/bf16 tables,
every fused optimizer and none (dense gradients). After each step: the output, the gradient of
the per-sample weights, the tables and the optimizer state. The same tests run the CUDA kernel
(marked ``gpu``) where there is a GPU.
"""

from __future__ import annotations

import logging

import pytest
import torch

from shardkit import kernels
from shardkit.kernels import use_kernel
from shardkit.modules import _kernel
from shardkit.modules._kernel import BatchedTables, lookup
from shardkit.optim import EmbOptimType, FusedOptimizerConfig, RowOptimizer

ROWS = (7, 30, 12)
STARTS = (0, 7, 37, 49)
DIM = 5
STEPS = 3
# The rules with a compiled kernel; FBGEMM's LAMB, LARS_SGD and partial row-wise rules run on the
# eager kernel only (test_the_other_rules_say_they_run_eager).
COMPILED_RULES = [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD,
                  EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.ADAM]  # fmt: skip
OPTIMIZERS = [None, *COMPILED_RULES]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]
TOLERANCE = {
    torch.float32: {},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def _batch(seed: int, batch_size: int, *, weighted: bool, mean: bool, id_dtype: torch.dtype):
    """(ids, offsets, per-sample weights or None): bags of 0-4 ids of each table, a hot id."""
    g = torch.Generator().manual_seed(seed)
    ids, lengths = [], []
    for rows, start in zip(ROWS, STARTS):
        for _ in range(batch_size):
            length = int(torch.randint(0, 5, (1,), generator=g))
            bag = torch.randint(0, rows, (length,), generator=g)
            if length > 2:
                bag[1] = bag[0]  # a duplicate within the bag
            ids.append(bag + start)
            lengths.append(length)
    ids = torch.cat(ids)
    ids[ids < STARTS[1]] = 3  # table 0's ids all hit one row: duplicates across bags
    lengths = torch.tensor(lengths)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    weights = torch.rand(ids.numel(), generator=g) if weighted else None
    if mean:
        per_id = (1.0 / lengths.clamp(min=1).float()).repeat_interleave(lengths)
        weights = per_id if weights is None else weights * per_id
    return ids.to(id_dtype), offsets, weights


def _tables(
    kind: EmbOptimType | None, dtype: torch.dtype, weight_decay: float = 0.0, device: str = "cpu"
):
    weight = torch.randn(STARTS[-1], DIM, generator=torch.Generator().manual_seed(7))
    weight = weight.to(device=device, dtype=dtype)
    optimizer = None
    if kind is not None:
        config = FusedOptimizerConfig(
            kind, learning_rate=0.05, eps=1e-6, weight_decay=weight_decay, beta1=0.8, beta2=0.9
        )
        optimizer = RowOptimizer(config, STARTS[-1], DIM, torch.device(device))
        for state in optimizer.state.values():
            generator = torch.Generator().manual_seed(3)
            state.copy_(torch.rand(state.shape, generator=generator) * 0.5)
    tables = BatchedTables(weight, list(STARTS), optimizer)
    ids = torch.zeros(1, dtype=torch.int64)
    if dtype != torch.float64:  # anything else must run compiled, or the test compares eager twice
        assert kernels.unsupported(weight, ids, optimizer) is None, f"no compiled kernel: {device}"
    return tables, [torch.nn.Parameter(v) for v in tables.table_views()]


def _step(path, tables, params, ids, offsets, weights, grad_out, batch_size=None):
    """One lookup + backward on ``path``; returns (output, per-sample weights' gradient)."""
    device = tables.weight.device
    ids = ids.to(device)
    offsets = None if offsets is None else offsets.to(device)
    grad_out = grad_out.to(device)
    weights = None if weights is None else weights.to(device).clone().requires_grad_()
    with use_kernel(path):
        out = lookup(tables, ids, offsets, weights, params, batch_size=batch_size)
    out.backward(grad_out.to(out.dtype))
    return out.detach(), None if weights is None else weights.grad


def _train_both(
    kind, dtype, *, batch_size, weighted, mean, id_dtype, weight_decay=0.0, device="cpu"
):
    eager = _tables(kind, dtype, weight_decay, device)
    compiled = _tables(kind, dtype, weight_decay, device)
    tolerance = TOLERANCE[dtype]
    for step in range(STEPS):
        ids, offsets, weights = _batch(
            step, batch_size, weighted=weighted, mean=mean, id_dtype=id_dtype
        )
        grad_out = torch.randn(
            offsets.numel() - 1, DIM, generator=torch.Generator().manual_seed(step)
        )
        expected = _step("eager", *eager, ids, offsets, weights, grad_out)
        actual = _step("compiled", *compiled, ids, offsets, weights, grad_out)
        message = f"step {step}"
        torch.testing.assert_close(actual[0], expected[0], **tolerance, msg=message)
        if weights is not None:
            torch.testing.assert_close(actual[1], expected[1], **tolerance, msg=message)
        _assert_same_tables(compiled, eager, tolerance, message)


def _assert_same_tables(actual, expected, tolerance, message):
    (tables, params), (ref_tables, ref_params) = actual, expected
    torch.testing.assert_close(tables.weight, ref_tables.weight, **tolerance, msg=message)
    if tables.optimizer is None:
        for param, ref in zip(params, ref_params):
            torch.testing.assert_close(param.grad, ref.grad, **tolerance, msg=message)
            param.grad = ref.grad = None
        return
    assert tables.optimizer.step == ref_tables.optimizer.step
    for name, state in tables.optimizer.state.items():
        torch.testing.assert_close(
            state, ref_tables.optimizer.state[name], **tolerance, msg=f"{message}, {name}"
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize(("weighted", "mean"), [(False, False), (True, False), (False, True)])
def test_pooled_matches_eager(kind, dtype, weighted, mean, device):
    _train_both(
        kind, dtype, batch_size=4, weighted=weighted, mean=mean, id_dtype=torch.int64,
        device=device,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=str)
def test_batch_of_one_weighted_mean_int32_and_int64_ids(kind, id_dtype, device):
    _train_both(
        kind, torch.float32, batch_size=1, weighted=True, mean=True, id_dtype=id_dtype,
        device=device,
    )  # fmt: skip


@pytest.mark.parametrize(("weighted", "mean"), [(False, False), (True, True)])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=str)
def test_sgd_on_one_thread_matches_eager(one_thread, weighted, mean, id_dtype):
    """On one thread fp32 SGD skips the grouping (see [Note: SGD without a sort])."""
    _train_both(
        EmbOptimType.EXACT_SGD, torch.float32, batch_size=4, weighted=weighted, mean=mean,
        id_dtype=id_dtype,
    )  # fmt: skip


def test_sgd_on_one_thread_per_id_matches_eager(one_thread):
    _per_id_both(EmbOptimType.EXACT_SGD, torch.float32, "cpu")


@pytest.mark.parametrize("dim", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
def test_row_lengths_compiled_in_match_eager(one_thread, monkeypatch, kind, dim):
    """The dims whose loops are specialized at compile time (forward, grouped update, SGD without
    a sort); weighted, so that every specialized loop runs."""
    monkeypatch.setattr(f"{__name__}.DIM", dim)
    _train_both(kind, torch.float32, batch_size=5, weighted=True, mean=False, id_dtype=torch.int64)


@pytest.mark.parametrize("dim", [16, 64])
@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
def test_rows_in_registers_unweighted_with_weight_decay_match_eager(
    one_thread, monkeypatch, kind, dim
):
    """fp32 rows at a dim compiled in sum a row's gradient in registers and apply the rule from
    there ([Note: a row's gradient in registers] in csrc/backward.cpp): the test above runs that
    loop with per-sample weights, this one without them (its other instance) and with weight
    decay (which also keeps one-thread SGD on the grouped path)."""
    monkeypatch.setattr(f"{__name__}.DIM", dim)
    _train_both(
        kind, torch.float32, batch_size=5, weighted=False, mean=False, id_dtype=torch.int64,
        weight_decay=0.0 if kind is None else 0.1,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", COMPILED_RULES, ids=lambda k: k.value)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weight_decay_matches_eager(kind, dtype, device):
    _train_both(
        kind, dtype, batch_size=3, weighted=True, mean=False, id_dtype=torch.int64,
        weight_decay=0.1, device=device,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_per_id_lookup_matches_eager(kind, dtype, device):
    """The sequence form (`EmbeddingCollection`): one output row per id, no offsets."""
    _per_id_both(kind, dtype, device)


def _per_id_both(kind, dtype, device):
    eager, compiled = _tables(kind, dtype, device=device), _tables(kind, dtype, device=device)
    for step in range(STEPS):
        ids, _, _ = _batch(step, 4, weighted=False, mean=False, id_dtype=torch.int64)
        grad_out = torch.randn(ids.numel(), DIM, generator=torch.Generator().manual_seed(step))
        expected = _step("eager", *eager, ids, None, None, grad_out)
        actual = _step("compiled", *compiled, ids, None, None, grad_out)
        torch.testing.assert_close(actual[0], expected[0])
        _assert_same_tables(compiled, eager, TOLERANCE[dtype], f"step {step}")


@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
@pytest.mark.parametrize("path", ["compiled", "eager"])
def test_example_major_output_is_the_key_major_one_transposed(kind, path):
    """``batch_size=B``: ``[B, K * D]`` (a KeyedTensor's values) instead of ``[K * B, D]``."""
    batch_size, num_keys = 4, len(ROWS)
    key_major, example_major = _tables(kind, torch.float32), _tables(kind, torch.float32)
    for step in range(STEPS):
        ids, offsets, weights = _batch(
            step, batch_size, weighted=True, mean=False, id_dtype=torch.int64
        )
        grad = torch.randn(
            batch_size, num_keys * DIM, generator=torch.Generator().manual_seed(step)
        )
        as_keys = grad.view(batch_size, num_keys, DIM).transpose(0, 1).reshape(-1, DIM)
        expected = _step(path, *key_major, ids, offsets, weights, as_keys)
        actual = _step(path, *example_major, ids, offsets, weights, grad, batch_size=batch_size)
        transposed = expected[0].view(num_keys, batch_size, DIM).transpose(0, 1)
        torch.testing.assert_close(actual[0], transposed.reshape(batch_size, -1))
        torch.testing.assert_close(actual[1], expected[1])
        _assert_same_tables(example_major, key_major, {}, f"step {step}")


def test_empty_batch_is_a_no_op():
    tables, params = _tables(EmbOptimType.ADAM, torch.float32)
    before = tables.weight.clone()
    ids, offsets = torch.empty(0, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    out, _ = _step("compiled", tables, params, ids, offsets, None, torch.ones(3, DIM))
    assert out.shape == (3, DIM) and not out.any()
    torch.testing.assert_close(tables.weight, before)
    assert tables.optimizer.step == 1  # a step happened, it touched no row


@pytest.mark.parametrize("kind", [None, EmbOptimType.EXACT_SGD])
def test_out_of_range_id_is_an_index_error_before_any_update(kind):
    tables, params = _tables(kind, torch.float32)
    before = tables.weight.clone()
    ids = torch.tensor([1, STARTS[-1], 2])
    offsets = torch.tensor([0, 2, 3])
    with pytest.raises(IndexError, match=r"id 49 at position 1 is out of range: ids must satisfy"):
        _step("compiled", tables, params, ids, offsets, None, torch.ones(2, DIM))
    torch.testing.assert_close(tables.weight, before)


def test_offsets_that_do_not_cover_the_ids_are_a_value_error():
    tables, params = _tables(None, torch.float32)
    with pytest.raises(ValueError, match=r"offsets must start at 0 and end at the number of ids"):
        _step("compiled", tables, params, torch.tensor([1, 2]), torch.tensor([0, 1]), None,
              torch.ones(1, DIM))  # fmt: skip


def test_unsupported_tables_run_eager_and_say_so_once(caplog, monkeypatch):
    """float64 tables have no compiled kernel: they run eager, with one INFO line."""
    monkeypatch.setattr(_kernel, "_unsupported_logged", set())
    tables, params = _tables(EmbOptimType.EXACT_SGD, torch.float64)
    reference, ref_params = _tables(EmbOptimType.EXACT_SGD, torch.float64)
    ids, offsets, _ = _batch(0, 2, weighted=False, mean=False, id_dtype=torch.int64)
    grad_out = torch.ones(offsets.numel() - 1, DIM)
    with caplog.at_level(logging.INFO, logger="shardkit.modules._kernel"):
        for _ in range(2):
            _step("compiled", tables, params, ids, offsets, None, grad_out)
            _step("eager", reference, ref_params, ids, offsets, None, grad_out)
    torch.testing.assert_close(tables.weight, reference.weight)
    lines = [r.getMessage() for r in caplog.records if "run the eager kernel" in r.getMessage()]
    assert lines == [
        "these embedding lookups run the eager kernel: no compiled kernel for torch.float64 tables"
    ]


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: "dense" if k is None else k.value)
def test_two_threads_on_a_batch_big_enough_to_split(two_threads, kind):
    """Forward splits the bags and backward the sorted ids (at row boundaries) between threads
    from 4096 ids on; hot rows make the split points fall inside runs of one row."""
    rows, dim, num_bags = 50, 8, 700
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(0, 16, (num_bags,), generator=g)
    offsets = torch.zeros(num_bags + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    ids = torch.randint(0, rows, (int(offsets[-1]),), generator=g) % 7  # 7 hot rows
    assert ids.numel() > 4096
    weights = torch.rand(ids.numel(), generator=g)
    sides = []
    for path in ("eager", "compiled"):
        weight = torch.randn(rows, dim, generator=torch.Generator().manual_seed(5))
        optimizer = None
        if kind is not None:
            config = FusedOptimizerConfig(kind, learning_rate=0.05)
            optimizer = RowOptimizer(config, rows, dim, torch.device("cpu"))
        tables = BatchedTables(weight, [0, rows], optimizer)
        params = [torch.nn.Parameter(v) for v in tables.table_views()]
        grad_out = torch.randn(num_bags, dim, generator=torch.Generator().manual_seed(6))
        out = _step(path, tables, params, ids, offsets, weights, grad_out)
        sides.append((out, tables, params))
    (expected, *reference), (actual, *mine) = sides
    torch.testing.assert_close(actual[0], expected[0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(actual[1], expected[1], atol=1e-4, rtol=1e-5)
    _assert_same_tables(mine, reference, {"atol": 1e-4, "rtol": 1e-5}, "2 threads")


@pytest.mark.parametrize("kind", sorted(set(EmbOptimType) - set(COMPILED_RULES), key=str))
def test_the_other_rules_say_they_run_eager(kind):
    config = FusedOptimizerConfig(kind, learning_rate=0.05)
    optimizer = RowOptimizer(config, 4, DIM, torch.device("cpu"))
    weight = torch.zeros(4, DIM)
    reason = kernels.unsupported(weight, torch.zeros(1, dtype=torch.int64), optimizer)
    assert reason == f"no compiled rule for {kind.value}"
