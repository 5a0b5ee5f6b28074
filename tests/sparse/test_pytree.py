"""The sparse types as pytree nodes (see [Note: sparse pytrees]): leaves and structure, the same
structure for lengths and offsets, round trips (also through a serialized spec), and a KJT
passing into and out of `torch.export` with a dynamic batch size and number of ids."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from shardkit import JaggedTensor, KeyedJaggedTensor, KeyedTensor


def _kjt(**extra) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3, 4, 5, 6]),
                             lengths=torch.tensor([2, 0, 1, 1, 1, 1]), **extra)  # fmt: skip


def _same_kjt(got: KeyedJaggedTensor, want: KeyedJaggedTensor) -> None:
    assert got.keys() == want.keys()
    assert got.stride() == want.stride()
    assert got.stride_per_key_per_rank() == want.stride_per_key_per_rank()
    for name in ("values", "lengths", "offsets", "weights_or_none"):
        a, b = getattr(got, name)(), getattr(want, name)()
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "kjt",
    [
        _kjt(),
        _kjt(weights=torch.rand(6)),
        KeyedJaggedTensor(
            ["a", "b"],
            torch.tensor([1, 2, 3]),
            lengths=torch.tensor([1, 0, 2]),
            stride_per_key_per_rank=[[1], [2]],
            inverse_indices=(["a", "b"], torch.tensor([[0, 0], [0, 1]])),
        ),
    ],
    ids=["plain", "weighted", "vbe"],
)
def test_kjt_round_trip(kjt):
    leaves, spec = pytree.tree_flatten(kjt)
    assert all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves)
    _same_kjt(pytree.tree_unflatten(leaves, spec), kjt)
    loaded = pytree.treespec_loads(pytree.treespec_dumps(spec))
    _same_kjt(pytree.tree_unflatten(leaves, loaded), kjt)


def test_kjt_structure_is_keys_not_sizes_or_offsets():
    """Another batch size, lengths or offsets, cached metadata, weights or not (a None leaf):
    one structure; other keys: another."""
    spec = pytree.tree_structure(_kjt())
    other_batch = KeyedJaggedTensor(["a", "b"], torch.tensor([7]), lengths=torch.tensor([1, 0]))
    from_offsets = KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3, 4, 5, 6]),
                                     offsets=torch.tensor([0, 2, 2, 3, 4, 5, 6]))  # fmt: skip
    for same in (other_batch, from_offsets, _kjt().sync(), _kjt(weights=torch.rand(6))):
        assert pytree.tree_structure(same) == spec
    other_keys = KeyedJaggedTensor(["b", "a"], torch.tensor([1]), lengths=torch.tensor([1, 0]))
    assert pytree.tree_structure(other_keys) != spec


def test_jt_and_kt_round_trip():
    jt = JaggedTensor(torch.tensor([1.0, 2.0, 3.0]), weights=torch.rand(3),
                      lengths=torch.tensor([2, 1]))  # fmt: skip
    got = pytree.tree_unflatten(*pytree.tree_flatten(jt))
    torch.testing.assert_close(got.values(), jt.values())
    torch.testing.assert_close(got.offsets(), jt.offsets())
    torch.testing.assert_close(got.weights(), jt.weights())
    kt = KeyedTensor(["x", "y"], [1, 2], torch.arange(6.0).view(2, 3))
    leaves, spec = pytree.tree_flatten(kt)
    got = pytree.tree_unflatten(leaves, pytree.treespec_loads(pytree.treespec_dumps(spec)))
    assert (got.keys(), got.length_per_key(), got.key_dim()) == (["x", "y"], [1, 2], 1)
    torch.testing.assert_close(got["y"], kt["y"])
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(_kjt())[0]]
    assert paths == ["._values", "._weights", "._lengths", "._inverse_indices"]


class _PerKeySums(torch.nn.Module):
    """KJT in, KeyedTensor and JaggedTensor out: every id summed per key, and key "b"."""

    def forward(self, kjt: KeyedJaggedTensor):
        lengths = kjt.lengths()
        batch = lengths.numel() // 2
        bags = torch.repeat_interleave(torch.arange(2 * batch), lengths,
                                       output_size=kjt.values().numel())  # fmt: skip
        sums = torch.zeros(2 * batch).index_add_(0, bags, kjt.values().float())
        kt = KeyedTensor(["a", "b"], [1, 1], sums.view(2, batch).t().contiguous())
        return kt, JaggedTensor(kjt.values() * 2, lengths=lengths)


def test_export_with_dynamic_batch_and_ids():
    batch, ids = torch.export.Dim("batch"), torch.export.Dim("ids")
    program = torch.export.export(
        _PerKeySums(), (_kjt(),), dynamic_shapes=([{0: ids}, None, {0: 2 * batch}, None],)
    )
    for kjt in (_kjt(), KeyedJaggedTensor(["a", "b"], torch.arange(9),
                                          lengths=torch.tensor([3, 0, 1, 2, 1, 0, 0, 2]))):  # fmt: skip
        got_kt, got_jt = program.module()(kjt)
        want_kt, want_jt = _PerKeySums()(kjt)
        assert got_kt.keys() == ["a", "b"]
        torch.testing.assert_close(got_kt.values(), want_kt.values())
        torch.testing.assert_close(got_jt.values(), want_jt.values())
        torch.testing.assert_close(got_jt.lengths(), want_jt.lengths())
