"""FBGEMM's LAMB, LARS-SGD, partial row-wise Adam and partial row-wise LAMB: as dense optimizers
and fused into the embedding kernel, each against a row-by-row reference written from FBGEMM's
formulas (``codegen/genscript/optimizers.py``) in float64.

FBGEMM's CPU build has none of these rules ("not supported in CPU mode") and TorchRec's classes
are placeholders whose ``step`` raises, so there is nothing in the peers venv to compare with.
"""

from __future__ import annotations

import math

import pytest
import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.optim import (
    LAMB,
    EmbOptimType,
    FusedOptimizerConfig,
    LarsSGD,
    PartialRowWiseAdam,
    PartialRowWiseLAMB,
    apply_optimizer_in_backward,
)
from shardkit.optim import optimizers as trec

HYPER = {"lr": 0.1, "eps": 1e-6, "beta1": 0.8, "beta2": 0.95, "weight_decay": 0.05}
LARS = {"lr": 0.5, "eta": 0.2, "momentum": 0.7, "weight_decay": 0.05}


def _reference_row(kind: str, w, g, state: dict, t: int, h: dict) -> list[float]:
    """One row's new weights, FBGEMM's arithmetic written out; updates ``state`` (lists)."""
    d = len(w)
    if kind == "lars_sgd":
        wn, gn = math.sqrt(sum(x * x for x in w)), math.sqrt(sum(x * x for x in g))
        lr = h["lr"] * h["eta"] * wn / (gn + h["weight_decay"] * wn)
        m = [h["momentum"] * m + lr * (gi + h["weight_decay"] * wi)
             for m, gi, wi in zip(state["m1"], g, w)]  # fmt: skip
        state["m1"] = m
        return [wi - mi for wi, mi in zip(w, m)]
    b1, b2 = h["beta1"], h["beta2"]
    state["m1"] = [b1 * m + (1 - b1) * gi for m, gi in zip(state["m1"], g)]
    m1_hat = [m / (1 - b1**t) for m in state["m1"]]
    if kind.startswith("partial"):
        state["m2"] = b2 * state["m2"] + (1 - b2) * sum(gi * gi for gi in g) / d
        denom = [math.sqrt(state["m2"] / (1 - b2**t)) + h["eps"]] * d
    else:
        state["m2"] = [b2 * m + (1 - b2) * gi * gi for m, gi in zip(state["m2"], g)]
        denom = [math.sqrt(m / (1 - b2**t)) + h["eps"] for m in state["m2"]]
    update = [m / s + h["weight_decay"] * wi for m, s, wi in zip(m1_hat, denom, w)]
    if kind == "partial_row_wise_adam":
        return [wi - h["lr"] * u for wi, u in zip(w, update)]
    ratio = math.sqrt(sum(x * x for x in w)) / math.sqrt(sum(u * u for u in update))
    return [wi - h["lr"] * ratio * u for wi, u in zip(w, update)]


def _new_state(kind: str, d: int) -> dict:
    return {"m1": [0.0] * d, "m2": 0.0 if kind.startswith("partial") else [0.0] * d}


CASES = [
    (LAMB, "lamb", HYPER),
    (PartialRowWiseLAMB, "partial_row_wise_lamb", HYPER),
    (PartialRowWiseAdam, "partial_row_wise_adam", HYPER),
    (LarsSGD, "lars_sgd", LARS),
]


@pytest.mark.parametrize(("cls", "kind", "hyper"), CASES)
def test_dense_optimizer_matches_the_reference_row_by_row(cls, kind, hyper):
    g = torch.Generator().manual_seed(0)
    start = torch.randn(3, 5, generator=g)
    grads = [torch.randn(3, 5, generator=g) for _ in range(3)]
    param = torch.nn.Parameter(start.clone())
    optimizer = cls([param], **hyper)
    rows = start.double().tolist()
    states = [_new_state(kind, 5) for _ in rows]
    for t, grad in enumerate(grads, start=1):
        param.grad = grad.clone()
        optimizer.step()
        rows = [_reference_row(kind, w, gr, s, t, hyper)
                for w, gr, s in zip(rows, grad.double().tolist(), states)]  # fmt: skip
    torch.testing.assert_close(param.detach(), torch.tensor(rows, dtype=torch.float32))
    assert int(optimizer.state[param]["step"]) == 3


def _ebc() -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=7,
                                   feature_names=["f"])]
    )  # fmt: skip


def _batches() -> list[KeyedJaggedTensor]:
    # rows 0, 1, 2, 5 touched (1 twice in a bag, 2 in two bags); rows 3, 4, 6 never
    return [
        KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 1, 2, 5, 2]),
                          lengths=torch.tensor([3, 0, 2])),
        KeyedJaggedTensor(keys=["f"], values=torch.tensor([0, 2, 5]),
                          lengths=torch.tensor([1, 1, 1])),
    ]  # fmt: skip


@pytest.mark.parametrize(("cls", "kind", "hyper"), CASES)
def test_fused_rule_updates_the_touched_rows_as_the_reference(cls, kind, hyper):
    ebc = _ebc()
    start = ebc.embedding_bags["t"].weight.detach().clone()
    apply_optimizer_in_backward(cls, ebc.parameters(), hyper)
    assert ebc.fused_optimizer.param_groups[0]["optimizer"] == kind
    rows = start.double().tolist()
    states = [_new_state(kind, 4) for _ in rows]
    seen: set[int] = set()
    for t, kjt in enumerate(_batches(), start=1):
        table = torch.nn.EmbeddingBag.from_pretrained(
            torch.tensor(rows, dtype=torch.float32), freeze=False, mode="sum"
        )
        out = ebc(kjt).values()
        out.pow(2).sum().backward()  # fused: the table updates here
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), kjt.lengths().cumsum(0)[:-1]])
        table(kjt.values(), offsets).pow(2).sum().backward()
        grad = table.weight.grad.double().tolist()
        for r in sorted(set(kjt.values().tolist())):
            rows[r] = _reference_row(kind, rows[r], grad[r], states[r], t, hyper)
            seen.add(r)
    weight = ebc.embedding_bags["t"].weight.detach()
    torch.testing.assert_close(weight, torch.tensor(rows, dtype=torch.float32))
    untouched = sorted(set(range(7)) - seen)
    torch.testing.assert_close(weight[untouched], start[untouched], rtol=0, atol=0)
    m1 = ebc.fused_optimizer.state_dict()["state"]["embedding_bags.t.weight"]["t.momentum1"]
    torch.testing.assert_close(m1, torch.tensor([s["m1"] for s in states], dtype=torch.float32))


def test_fused_params_reach_the_rule_and_lars_keys_belong_to_lars():
    config = FusedOptimizerConfig.from_fused_params(
        {"optimizer": EmbOptimType.LARS_SGD, "learning_rate": 0.5, "momentum": 0.7, "eta": 0.2}
    )
    assert (config.momentum, config.eta) == (0.7, 0.2)
    assert config.hyperparameters()["momentum"] == 0.7
    assert EmbOptimType.parse("partial_rowwise_adam") == EmbOptimType.PARTIAL_ROWWISE_ADAM
    with pytest.raises(ValueError, match=r"fused_params key 'eta' \(0.1\): used only by FBGEMM's "
                       r"LARS_SGD: set optimizer to LARS_SGD, or drop the key"):  # fmt: skip
        FusedOptimizerConfig.from_fused_params({"optimizer": "lamb", "eta": 0.1})
    with pytest.raises(ValueError, match=r"momentum \(0.5\) and eta \(0.001\) are LARS_SGD's; "
                       r"LAMB does not use them"):  # fmt: skip
        FusedOptimizerConfig(optimizer=EmbOptimType.LAMB, momentum=0.5)
    with pytest.raises(ValueError, match=r"LAMB kwargs \['betas'\] are not supported fused"):
        FusedOptimizerConfig.from_optimizer_class(LAMB, {"betas": (0.9, 0.99)})


def test_bad_arguments_name_the_known_ones():
    param = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(TypeError, match=r"LarsSGD got unknown argument\(s\) \['beta1'\]; it "
                       r"takes \['lr', 'eta', 'momentum', 'weight_decay'\]"):  # fmt: skip
        LarsSGD([param], beta1=0.9)
    with pytest.raises(ValueError, match=r"PartialRowWiseAdam: lr \(-1\) and weight_decay"):
        PartialRowWiseAdam([param], lr=-1)
    assert trec.LAMB is LAMB


def test_a_row_with_a_zero_update_does_not_move():
    """FBGEMM would divide by the zero norm (NaN); see [Note: layer-wise rules per row]."""
    param = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    optimizer = LarsSGD([param], lr=1.0, eta=1.0)  # no weight decay
    param.grad = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    optimizer.step()
    assert param[0].tolist() == [1.0, 2.0]
    assert param[1, 0].item() < 3.0
    assert torch.isfinite(param).all()
