"""Optimizers in backward, however asked (shardkit's, TorchRec's or torch's function), the filter
that keeps those parameters from the dense optimizer, and TorchRec's optimizer classes."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.optim import _apply_optimizer_in_backward

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.compat import NotInShardkitError
from shardkit.optim import (
    CombinedOptimizer,
    FusedOptimizerConfig,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
)
from shardkit.optim import optimizers as trec
from shardkit.optim.fused import EmptyFusedOptimizer
from shardkit.optim.optimizers import in_backward_optimizer_filter


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=9,
                                   feature_names=[f"f{i}"])
                for i in range(2)
            ]
        )  # fmt: skip
        self.head = torch.nn.Linear(8, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.head(self.ebc(kjt).values())


def _batch(seed: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (6,), generator=g)
    values = torch.randint(0, 9, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=["f0", "f1"], values=values, lengths=lengths)


def _train(model: _Model, dense: torch.optim.Optimizer, steps: int = 3) -> None:
    for step in range(steps):
        dense.zero_grad()
        model(_batch(step)).pow(2).mean().backward()
        dense.step()


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8}),
        (torch.optim.Adam, {"lr": 0.05}),
        (trec.Adam, {"lr": 0.05}),
        (trec.SGD, {"lr": 0.3}),
        (trec.Adagrad, {"lr": 0.1, "eps": 1e-8}),
    ],
)
def test_a_collection_trains_the_same_whichever_function_marked_it(cls, kwargs):
    ours, torchs = _Model(), _Model()
    apply_optimizer_in_backward(cls, ours.ebc.parameters(), kwargs)
    _apply_optimizer_in_backward(cls, torchs.ebc.parameters(), kwargs)
    for model in (ours, torchs):
        names = [n for n, _ in in_backward_optimizer_filter(model.named_parameters(), True)]
        assert names == ["ebc.embedding_bags.t0.weight", "ebc.embedding_bags.t1.weight"]
    start = ours.ebc.embedding_bags.t0.weight.detach().clone()
    for model in (ours, torchs):
        dense = dict(in_backward_optimizer_filter(model.named_parameters()))
        assert sorted(dense) == ["head.bias", "head.weight"]
        _train(model, KeyedOptimizerWrapper(dense, lambda p: torch.optim.SGD(p, lr=0.1)))
    for a, b in zip(ours.parameters(), torchs.parameters()):
        assert a.grad is None or a.dim() == 1 or a.shape[0] == 1
        torch.testing.assert_close(a, b)
    assert not torch.equal(ours.ebc.embedding_bags.t0.weight, start), "the tables trained"
    assert ours.ebc.fused_optimizer is not None and torchs.ebc.fused_optimizer is not None


def test_fused_tables_and_a_dense_optimizer_combine_as_in_torchrec():
    model = _Model()
    apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": 0.1})
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=0.01),
    )
    model(_batch(0)).sum().backward()  # builds the fused optimizer
    combined = CombinedOptimizer([("ebc", model.ebc.fused_optimizer), dense])
    assert isinstance(model.ebc.fused_optimizer, KeyedOptimizer)
    assert sorted(combined.params) == [
        "ebc.embedding_bags.t0.weight", "ebc.embedding_bags.t1.weight", "head.bias", "head.weight",
    ]  # fmt: skip
    scheduler = torch.optim.lr_scheduler.ExponentialLR(combined, gamma=0.5)
    _train(model, combined, 1)
    scheduler.step()
    assert [g["lr"] for g in combined.param_groups] == pytest.approx([0.05, 0.005])


def test_dense_parameters_step_in_their_hook_with_torchs_markers():
    model = torch.nn.Linear(3, 1)
    apply_optimizer_in_backward(torch.optim.SGD, model.parameters(), {"lr": 0.5})
    assert model.weight._optimizer_classes == [torch.optim.SGD]
    assert isinstance(model.weight._in_backward_optimizers[0], torch.optim.SGD)
    assert [n for n, _ in in_backward_optimizer_filter(model.named_parameters())] == []


def test_the_table_marker_is_an_empty_fused_optimizer():
    model = _Model()
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.5})
    marker = model.ebc.embedding_bags.t0.weight._in_backward_optimizers
    assert len(marker) == 1 and isinstance(marker[0], EmptyFusedOptimizer)
    assert marker[0].state_dict() == {"state": {}}


def test_refusals_name_what_to_use():
    model = _Model()
    with pytest.raises(NotInShardkitError, match=r"shardkit.optim has no SemisyncOptimizer: "
                       r"cross-region semi-synchronous training"):  # fmt: skip
        from shardkit.optim import SemisyncOptimizer  # noqa: F401
    with pytest.raises(TypeError, match=r"SGD got unknown argument\(s\) \['max_gradient'\]"):
        trec.SGD(model.head.parameters(), lr=0.1, max_gradient=1.0)
    with pytest.raises(TypeError, match=r"RowWiseAdagrad got unknown argument\(s\) \['gradient"):
        RowWiseAdagrad(model.head.parameters(), gradient_clipping=True)
    with pytest.raises(ValueError, match=r"maximize=True is not supported fused"):
        FusedOptimizerConfig.from_optimizer_class(RowWiseAdagrad, {"maximize": True})
    _apply_optimizer_in_backward(torch.optim.SGD, [model.ebc.embedding_bags.t0.weight], {"lr": 1})
    _apply_optimizer_in_backward(torch.optim.Adam, [model.ebc.embedding_bags.t0.weight], {})
    with pytest.raises(ValueError, match=r"an embedding table was given 2 in-backward optimizers "
                       r"\['SGD', 'Adam'\]; the embedding kernel fuses one"):  # fmt: skip
        model(_batch(0))


def test_rowwise_adagrad_lr_decay_and_initial_accumulator():
    weight = torch.nn.Parameter(torch.ones(2, 3))
    optimizer = RowWiseAdagrad([weight], lr=0.1, lr_decay=0.5, initial_accumulator_value=1.0)
    grads = [torch.full((2, 3), 2.0), torch.full((2, 3), 1.0)]
    expected, acc = torch.ones(2, 3), torch.ones(2, 1)
    for t, grad in enumerate(grads, start=1):
        weight.grad = grad
        optimizer.step()
        acc += grad.pow(2).mean(1, keepdim=True)
        expected -= 0.1 / (1 + (t - 1) * 0.5) * grad / (acc.sqrt() + 1e-10)
    torch.testing.assert_close(weight.detach(), expected)
    torch.testing.assert_close(optimizer.state[weight]["sum"], acc)
