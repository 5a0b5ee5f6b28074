"""Peers tier (issue 27): a quantized state dict TorchRec 1.8 saved with ``torch.save`` (its
layout: FBGEMM rows, UInt4Tensor buffers; also its split scale/bias form) loads into shardkit's
quantized collection, which then serves TorchRec's outputs; shardkit's own quantization of the
same float tables is TorchRec's, byte for byte."""

from __future__ import annotations

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.compat import install_aliases, remove_aliases
from shardkit.inference import quantize_embeddings
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from tests.compat.peers import run_in_torchrec

# table -> (dim, storage dtype): INT8 16 columns (stored [rows, 32] by TorchRec), INT8 8 (the
# width shardkit's layout also has), INT4, INT2, FP16 of a dim that pads, FP32
TABLES = {"a": (16, torch.qint8), "b": (8, torch.qint8), "c": (16, torch.quint4x2),
          "d": (24, torch.quint4x2), "e": (16, torch.quint2x4), "f": (6, torch.float16),
          "g": (4, torch.float32)}  # fmt: skip

_TORCHREC = """
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.inference.modules import quantize_embeddings
from torchrec.quant.embedding_modules import (
    quant_prep_enable_quant_state_dict_split_scale_bias_for_types,
)
tables = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=11, feature_names=[n])
          for n, (d, _) in inputs["tables"].items()]
for split in (False, True):
    ebc = EmbeddingBagCollection(tables=tables)
    ebc.load_state_dict(inputs["float"])
    model = torch.nn.ModuleDict({"ebc": ebc})
    if split:
        quant_prep_enable_quant_state_dict_split_scale_bias_for_types(
            model, [EmbeddingBagCollection])
    per_table = {n: t for n, (_, t) in inputs["tables"].items()}
    q = quantize_embeddings(model, dtype=torch.qint8, inplace=True,
                            per_table_weight_dtype=per_table)
    # TorchRec's buffers view one FBGEMM weight as several dtypes, which torch.save refuses:
    # users save copies
    torch.save({k: v.clone() for k, v in q.state_dict().items()}, inputs["paths"][split])
    kjt = KeyedJaggedTensor(keys=list(inputs["tables"]), values=inputs["values"],
                            lengths=inputs["lengths"])
    outputs["out"] = q["ebc"](kjt).values()
    if not split:
        outputs["bytes"] = {k: v.view(torch.uint8) for k, v in q.state_dict().items()}
"""


def _float_ebc() -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=11, feature_names=[n])
            for n, (d, _) in TABLES.items()
        ]
    )


def _quantized(float_state):
    ebc = _float_ebc()
    ebc.load_state_dict(float_state)
    per_table = {n: t for n, (_, t) in TABLES.items()}
    model = torch.nn.ModuleDict({"ebc": ebc})
    return quantize_embeddings(model, dtype=torch.qint8, inplace=True,
                               per_table_weight_dtype=per_table)  # fmt: skip


@pytest.fixture(scope="module")
def torchrec_saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peers")
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4, (len(TABLES) * 5,), generator=g)
    values = torch.randint(0, 11, (int(lengths.sum()),), generator=g)
    paths = {False: str(tmp / "torchrec.pt"), True: str(tmp / "torchrec_split.pt")}
    inputs = {"tables": TABLES, "float": _float_ebc().state_dict(), "values": values,
              "lengths": lengths, "paths": paths}  # fmt: skip
    outputs = run_in_torchrec(_TORCHREC, inputs, tmp)
    return inputs, outputs


def _load_file(path: str) -> dict:
    install_aliases()  # TorchRec's UInt4Tensor pickles by TorchRec's path (shardkit run's view)
    try:
        return torch.load(path, weights_only=False)
    finally:
        remove_aliases()


@pytest.mark.parametrize("split", [False, True])
def test_a_state_dict_torchrec_saved_loads_and_serves_torchrecs_outputs(torchrec_saved, split):
    inputs, outputs = torchrec_saved
    state = _load_file(inputs["paths"][split])
    model = _quantized(_float_ebc().state_dict())  # other tables, which the file replaces
    model.load_state_dict(state)
    kjt = KeyedJaggedTensor(keys=list(TABLES), values=inputs["values"], lengths=inputs["lengths"])
    torch.testing.assert_close(model["ebc"](kjt).values(), outputs["out"], rtol=1e-6, atol=1e-6)


def test_shardkits_quantization_is_torchrecs_byte_for_byte(torchrec_saved):
    inputs, outputs = torchrec_saved
    model = _quantized(inputs["float"])
    mine = model["ebc"].tables_in_torchrec_layout()
    theirs = {k.removeprefix("ebc."): v for k, v in outputs["bytes"].items()}
    assert sorted(mine) == sorted(theirs)
    for key, value in mine.items():
        assert torch.equal(value.view(torch.uint8), theirs[key]), key
