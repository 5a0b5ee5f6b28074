"""KeyedTensor: per-key views and regroup, with gradients checked by gradcheck and by hand."""

from __future__ import annotations

import pytest
import torch

from shardkit.sparse import KeyedTensor

BATCH = 3
WIDTHS = {"product": 2, "user": 3, "ad": 1, "none": 0}


def _column(key: str, batch: int = BATCH, dtype=torch.float64) -> torch.Tensor:
    """Each key's tensor holds recognisable numbers: 100 * key index + 10 * row + column."""
    index = list(WIDTHS).index(key)
    rows = torch.arange(batch, dtype=dtype).view(-1, 1) * 10
    return 100 * index + rows + torch.arange(WIDTHS[key], dtype=dtype)


def _kts(dtype=torch.float64) -> list[KeyedTensor]:
    first = ["product", "user"]
    second = ["ad", "none"]
    return [
        KeyedTensor.from_tensor_list(first, [_column(k, dtype=dtype) for k in first]),
        KeyedTensor(second, [WIDTHS[k] for k in second],
                    torch.cat([_column(k, dtype=dtype) for k in second], dim=1)),
    ]  # fmt: skip


def test_keys_lengths_offsets_and_views():
    kt = _kts()[0]
    assert kt.keys() == ["product", "user"] and kt.key_dim() == 1
    assert kt.length_per_key() == [2, 3] and kt.offset_per_key() == [0, 2, 5]
    assert kt.values().shape == (BATCH, 5)
    assert torch.equal(kt["user"], _column("user"))
    assert kt["user"].data_ptr() == kt.values()[:, 2:].data_ptr()  # a view
    assert {k: v.tolist() for k, v in kt.to_dict().items()} == {
        "product": _column("product").tolist(),
        "user": _column("user").tolist(),
    }
    assert kt.device() == torch.device("cpu") and kt.to(torch.device("cpu")).keys() == kt.keys()


def test_key_dim_0():
    kt = KeyedTensor.from_tensor_list(["a", "b"], [torch.ones(1, 2), torch.zeros(2, 2)], 0, 0)
    assert kt.length_per_key() == [1, 2] and kt["b"].tolist() == [[0.0, 0.0], [0.0, 0.0]]


GROUPS = {
    "one_group_reordered": [["user", "product", "ad"]],
    "across_inputs": [["ad", "product"], ["user"]],
    "key_in_two_groups": [["user"], ["user", "ad"], ["product", "user"]],
    "unused_keys": [["ad"]],
    "empty_and_zero_width": [[], ["none", "product"]],
}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_regroup_concatenates_each_groups_keys(name):
    groups = GROUPS[name]
    out = KeyedTensor.regroup(_kts(), groups)
    for group, tensor in zip(groups, out, strict=True):
        expected = torch.cat([_column(k) for k in group], dim=1) if group else torch.empty(BATCH, 0)
        assert tensor.shape == expected.shape and torch.equal(tensor, expected.to(tensor.dtype))
    names = [f"g{i}" for i in range(len(groups))]
    as_dict = KeyedTensor.regroup_as_dict(_kts(), groups, names)
    assert list(as_dict) == names
    assert all(torch.equal(as_dict[n], t) for n, t in zip(names, out))


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_regroup_gradients_pass_gradcheck(name):
    groups = GROUPS[name]
    kts = _kts()
    inputs = [kt.values().clone().requires_grad_() for kt in kts]

    def fn(*values):
        rebuilt = [KeyedTensor(kt.keys(), kt.length_per_key(), v) for kt, v in zip(kts, values)]
        return tuple(KeyedTensor.regroup(rebuilt, groups))

    assert torch.autograd.gradcheck(fn, tuple(inputs))


def test_regroup_gradient_sums_over_groups_by_hand():
    kts = _kts(dtype=torch.float32)
    for kt in kts:
        kt.values().requires_grad_()
    groups = GROUPS["key_in_two_groups"]
    out = KeyedTensor.regroup(kts, groups)
    # loss = sum_g sum(out_g * (g + 1)): d loss / d key = sum over its groups of (g + 1)
    sum((tensor * (g + 1)).sum() for g, tensor in enumerate(out)).backward()
    factor = {"user": 1.0 + 2 + 3, "product": 3.0, "ad": 2.0}
    first, second = kts
    assert first.values().grad.tolist() == [[factor["product"]] * 2 + [factor["user"]] * 3] * BATCH
    assert second.values().grad.tolist() == [[factor["ad"]]] * BATCH


def test_regroup_leaves_inputs_without_used_keys_out_of_the_graph():
    kts = _kts(dtype=torch.float32)
    for kt in kts:
        kt.values().requires_grad_()
    KeyedTensor.regroup(kts, [["user"]])[0].sum().backward()
    assert kts[1].values().grad is None  # as TorchRec
    assert kts[0].values().grad.tolist() == [[0.0, 0.0, 1.0, 1.0, 1.0]] * BATCH


def test_record_stream(monkeypatch):
    recorded = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: recorded.append(s))
    _kts()[0].record_stream("stream")
    assert recorded == ["stream"]
