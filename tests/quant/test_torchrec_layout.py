"""Quantized tables in TorchRec's state-dict layout (issue 27): shardkit quantizes as FBGEMM does
(bytes pinned from TorchRec 1.8's state dict), loads TorchRec's layout (split scale/bias or not,
UInt4Tensor buffers, any row alignment) and writes it; its own layout still loads."""

from __future__ import annotations

import io

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.inference import quantize_embeddings
from shardkit.modules import DataType, EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.quant.embedding_modules import (
    quant_prep_customize_row_alignment,
    quant_prep_enable_quant_state_dict_split_scale_bias_for_types,
)
from shardkit.tensor_types import UInt4Tensor

# A 16-value row, and the bytes TorchRec 1.8 keeps for it in its quantized state dict
# (`quantize_embeddings(..., dtype=torch.qint8 / torch.quint4x2)`; FBGEMM's row: float16 scale
# and bias, the codes, zeros to 16-byte rows).
ROW = [-0.41678255796432495, 0.3973459005355835, 0.34004321694374084, -0.4461080729961395,
       0.08370588719844818, -0.07533760368824005, -0.07359398156404495, -0.20471510291099548,
       0.17197874188423157, -0.26488617062568665, 0.16394463181495667, 0.22615952789783478,
       0.32014748454093933, 0.1672181487083435, -0.4426230490207672, -0.29010605812072754]  # fmt: skip
TORCHREC_INT8 = [198, 26, 35, 183, 9, 255, 238, 0, 160, 112, 113, 73, 187, 55, 184, 203, 232,
                 185, 1, 47] + [0] * 12  # fmt: skip
TORCHREC_INT4 = [50, 43, 35, 183, 241, 14, 121, 71, 59, 203, 190, 48, 0, 0, 0, 0]
DTYPES = {DataType.FP32: torch.float32, DataType.FP16: torch.float16, DataType.INT8: torch.qint8,
          DataType.INT4: torch.quint4x2, DataType.INT2: torch.quint2x4}  # fmt: skip


def _quantized(dims: dict[str, tuple[int, DataType]], *, seed: int = 0, split=False, align=16):
    torch.manual_seed(seed)
    tables = [
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=9, feature_names=[name])
        for name, (dim, _) in dims.items()
    ]
    model = torch.nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=tables)})
    if split:
        quant_prep_enable_quant_state_dict_split_scale_bias_for_types(
            model, [EmbeddingBagCollection]
        )
    if align != 16:
        quant_prep_customize_row_alignment(model, [EmbeddingBagCollection], align)
    per_table = {name: DTYPES[data_type] for name, (_, data_type) in dims.items()}
    return quantize_embeddings(model, dtype=torch.qint8, inplace=True,
                               per_table_weight_dtype=per_table)["ebc"]  # fmt: skip


def _batch(names) -> KeyedJaggedTensor:
    lengths = torch.tensor([2, 0, 3] * len(names))
    values = torch.tensor([0, 8, 1, 2, 8] * len(names))
    return KeyedJaggedTensor(keys=list(names), values=values, lengths=lengths)


@pytest.mark.parametrize(("dtype", "expected"), [(torch.qint8, TORCHREC_INT8),
                                                 (torch.quint4x2, TORCHREC_INT4)])  # fmt: skip
def test_rows_are_torchrecs_bytes(dtype, expected):
    table = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=1, feature_names=["f"])
    model = torch.nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=[table])})
    with torch.no_grad():
        model["ebc"].embedding_bags["t"].weight.copy_(torch.tensor([ROW]))
    quantized = quantize_embeddings(model, dtype=dtype, inplace=True)["ebc"]
    rows = quantized.tables_in_torchrec_layout()["embedding_bags.t.weight"]
    assert rows.dtype == torch.uint8 and rows.view(torch.uint8)[0].tolist() == expected


KINDS = {"a": (16, DataType.INT8), "b": (8, DataType.INT8), "c": (16, DataType.INT4),
         "d": (24, DataType.INT4), "e": (16, DataType.INT2), "f": (6, DataType.FP16),
         "g": (4, DataType.FP32)}  # fmt: skip


@pytest.mark.parametrize(("split", "align"), [(False, 16), (True, 16), (False, 32)])
def test_torchrec_layout_round_trips_exactly(split, align):
    source = _quantized(KINDS, split=split, align=align)
    target = _quantized(KINDS, seed=1, align=align)  # other weights, which loading replaces
    theirs = source.state_dict() if split else source.tables_in_torchrec_layout()
    if split:
        assert theirs["embedding_bags.a.weight"].shape == (9, 16)
        assert theirs["embedding_bags.a.weight_qscale"].dtype == torch.float16
        assert type(theirs["embedding_bags.c.weight"]) is UInt4Tensor
    else:  # bytes per row, padded to the alignment
        widths = {k.split(".")[1]: v.view(torch.uint8).shape[1] for k, v in theirs.items()}
        expected = {"a": 32, "b": 16, "c": 16, "d": 16, "e": 16, "f": 16, "g": 16}
        if align == 32:
            expected = dict.fromkeys(expected, 32)
        assert widths == expected
    target.load_state_dict(theirs)
    batch = _batch(KINDS)
    torch.testing.assert_close(target(batch).values(), source(batch).values(), rtol=0, atol=0)
    mine = {k: v for k, v in source.state_dict().items() if "_q" not in k}
    if not split:
        for key, value in target.state_dict().items():
            assert torch.equal(value, mine[key]), key


def test_shardkits_own_layout_and_torchrecs_uint4_buffers_load():
    source = _quantized(KINDS)
    target = _quantized(KINDS, seed=1)
    target.load_state_dict(source.state_dict())  # shardkit's layout, "b" of the same width
    batch = _batch(KINDS)
    torch.testing.assert_close(target(batch).values(), source(batch).values(), rtol=0, atol=0)
    theirs = source.tables_in_torchrec_layout()
    buffer = io.BytesIO()
    torch.save(theirs, buffer)  # pickled and read back, as a saved file is
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded["embedding_bags.d.weight"]) is UInt4Tensor
    assert loaded["embedding_bags.d.weight"].shape == (9, 32)  # values, not bytes
    third = _quantized(KINDS, seed=2)
    third.load_state_dict(loaded)
    torch.testing.assert_close(third(batch).values(), source(batch).values(), rtol=0, atol=0)
