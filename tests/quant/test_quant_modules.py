"""Quantized collections against the float ones they come from: within the quantization error,
computed per data type from the float table and asserted per pooled value; exactly the lookup of
the dequantized table; state_dict round trips (also through the meta device); the errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardkit import KeyedJaggedTensor
from shardkit.inference import quantize_embeddings
from shardkit.modules import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
)
from shardkit.quant import EmbeddingBagCollection as QuantEBC
from shardkit.quant import EmbeddingCollection as QuantEC
from shardkit.quant import quantize_table_weights
from shardkit.quant._pack import unpack

DTYPES = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.INT8: torch.qint8,
    DataType.INT4: torch.quint4x2,
    DataType.INT2: torch.quint2x4,
}
FP16_EPS = 2.0**-11  # float16's relative rounding error


def row_error_bound(table: torch.Tensor, data_type: DataType) -> torch.Tensor:
    """``[rows]``: how far any stored value of a row may be from its float (see [Note: quantized
    rows]): half a quantization step, plus float16 rounding of scale and bias (FBGEMM's rule, for
    every n-bit type)."""
    low, high = table.min(1).values, table.max(1).values
    if data_type == DataType.FP32:
        return torch.zeros_like(low)
    if data_type == DataType.FP16:
        return table.abs().max(1).values * FP16_EPS
    levels = {DataType.INT8: 255, DataType.INT4: 15, DataType.INT2: 3}[data_type]
    step = (high - low) / levels
    return step / 2 + (levels + 1) * step * 2 * FP16_EPS + low.abs() * 2 * FP16_EPS


def _tables(pooling=PoolingType.SUM, dims=(8, 4)) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=dims[0], num_embeddings=13,
                           feature_names=["a", "b"], pooling=pooling),
        EmbeddingBagConfig(name="t1", embedding_dim=dims[1], num_embeddings=7,
                           feature_names=["c"], pooling=pooling),
        EmbeddingBagConfig(name="t2", embedding_dim=dims[0], num_embeddings=5,
                           feature_names=["d"], pooling=PoolingType.SUM),
    ]  # fmt: skip


def _batch(seed: int, weighted: bool) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    keys, rows = ["d", "c", "a", "b"], {"a": 13, "b": 13, "c": 7, "d": 5}
    lengths = torch.randint(0, 5, (4 * 6,), generator=g)
    per_key = lengths.view(4, 6).sum(1).tolist()
    values = torch.cat(
        [torch.randint(0, rows[k], (n,), generator=g) for k, n in zip(keys, per_key)]
    )
    weights = torch.rand(values.numel(), generator=g) * 2 - 0.5 if weighted else None
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights)


def _float_ebc(pooling=PoolingType.SUM, weighted=False, dims=(8, 4)) -> EmbeddingBagCollection:
    ebc = EmbeddingBagCollection(tables=_tables(pooling, dims), is_weighted=weighted)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in ebc.parameters():  # rows of different ranges and offsets
            param.copy_(torch.randn(param.shape, generator=g) * torch.rand(param.shape[0], 1, generator=g) * 3 + 1)  # fmt: skip
    return ebc


def _bag_bound(ebc, kjt: KeyedJaggedTensor, data_type: DataType) -> torch.Tensor:
    """``[B, sum(D)]``: sum over each bag of |weight| * the row's error bound."""
    per_row = {c.name: row_error_bound(ebc.embedding_bags[c.name].weight.detach(), data_type)
               for c in ebc.embedding_bag_configs()}  # fmt: skip
    pieces = []
    for config in ebc.embedding_bag_configs():
        for feature in config.feature_names:
            jt = kjt[feature]
            weights = jt.weights().abs() if ebc.is_weighted() else torch.ones(jt.values().numel())
            if config.pooling == PoolingType.MEAN:
                weights = weights / jt.lengths().clamp(min=1).repeat_interleave(jt.lengths())
            bound = F.embedding_bag(jt.values(), per_row[config.name][:, None], jt.offsets()[:-1],
                                    mode="sum", per_sample_weights=weights)  # fmt: skip
            pieces.append(bound.expand(-1, config.embedding_dim))
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("data_type", list(DTYPES))
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_quantized_ebc_is_the_float_one_within_the_quantization_error(data_type, pooling, weighted):
    ebc = _float_ebc(pooling, weighted)
    quantized = quantize_embeddings(ebc, dtype=DTYPES[data_type], inplace=False)
    assert isinstance(quantized, QuantEBC) and isinstance(ebc, EmbeddingBagCollection)
    for seed in range(3):
        kjt = _batch(seed, weighted)
        ours, theirs = quantized(kjt), ebc(kjt)
        assert ours.keys() == theirs.keys() and ours.length_per_key() == theirs.length_per_key()
        error = (ours.values() - theirs.values().detach()).abs()
        bound = _bag_bound(ebc, kjt, data_type)
        if data_type == DataType.FP16:  # the pooled vector is rounded to float16 once
            bound = bound + theirs.values().detach().abs() * FP16_EPS
        assert bool((error <= bound + 1e-5).all()), (error - bound).max()
        if data_type in (DataType.INT8, DataType.INT4):
            assert float(error.max()) > float(bound.max()) / 50  # it did quantize
        # exactly the lookup of the dequantized tables
        dequantized = EmbeddingBagCollection(tables=_tables(pooling), is_weighted=weighted)
        with torch.no_grad():
            for name, table in quantized.embedding_bags.items():
                dequantized.embedding_bags[name].weight.copy_(unpack(table.weight, data_type))
        torch.testing.assert_close(ours.values(), dequantized(kjt).values().detach(),
                                   rtol=FP16_EPS if data_type == DataType.FP16 else 1e-5,
                                   atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("data_type", [DataType.FP16, DataType.INT8, DataType.INT4])
def test_quantized_ec_rows_are_within_the_quantization_error(data_type):
    tables = [
        EmbeddingConfig(name="t0", embedding_dim=6, num_embeddings=13, feature_names=["a", "b"]),
        EmbeddingConfig(name="t1", embedding_dim=4, num_embeddings=7, feature_names=["c"]),
    ]
    ec = EmbeddingCollection(tables=tables)
    quantized = quantize_embeddings(
        ec, dtype=DTYPES[data_type], inplace=False, additional_qconfig_spec_keys=[EmbeddingCollection]
    )  # fmt: skip
    assert isinstance(quantized, QuantEC)
    kjt = KeyedJaggedTensor(keys=["c", "a", "b"], values=torch.tensor([6, 0, 12, 3, 3, 5]),
                            lengths=torch.tensor([1, 0, 2, 1, 0, 2]))  # fmt: skip
    ours, theirs = quantized(kjt), ec(kjt)
    assert list(ours) == ["a", "b", "c"]
    for feature, table in (("a", "t0"), ("b", "t0"), ("c", "t1")):
        weight = ec.embeddings[table].weight.detach()
        ids = kjt[feature].values()
        bound = row_error_bound(weight, data_type)[ids][:, None]
        assert bool(((ours[feature].values() - theirs[feature].values()).abs() <= bound + 1e-6).all())  # fmt: skip
        assert torch.equal(ours[feature].lengths(), theirs[feature].lengths())


def test_state_dict_round_trips_including_through_meta():
    ebc = _float_ebc(weighted=True)
    quantized = quantize_embeddings(ebc, dtype=torch.quint4x2, inplace=False)
    state = quantized.state_dict()
    assert list(state) == [f"embedding_bags.{t}.weight" for t in ("t0", "t1", "t2")]
    assert state["embedding_bags.t0.weight"].shape == (13, 8 // 2 + 4)  # codes, fp16 scale, bias
    kjt = _batch(7, weighted=True)
    fresh = QuantEBC(quantized.embedding_bag_configs(), is_weighted=True)  # zeros
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(kjt).values(), quantized(kjt).values(), rtol=0, atol=0)
    on_meta = _float_ebc(weighted=True).to_empty(device="meta")
    served = quantize_embeddings(on_meta, dtype=torch.quint4x2, inplace=True)
    served.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    torch.testing.assert_close(served(kjt).values(), quantized(kjt).values(), rtol=0, atol=0)
    # a saved float state dict quantized without the model, as `shardkit export --quantize` does
    packed = quantize_table_weights(ebc.state_dict(), DataType.INT4)
    from_file = quantize_embeddings(_float_ebc(weighted=True).to_empty(device="meta"),
                                    dtype=torch.quint4x2, inplace=True)  # fmt: skip
    from_file.load_state_dict(packed, assign=True)
    torch.testing.assert_close(from_file(kjt).values(), quantized(kjt).values(), rtol=0, atol=0)


def test_quantize_embeddings_swaps_collections_inside_models():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sparse = torch.nn.Sequential(_float_ebc())
            self.head = torch.nn.Linear(8 * 3 + 4, 1)

        def forward(self, kjt):
            return self.head(self.sparse(kjt).values())

    model = Model()
    kjt = _batch(1, weighted=False)
    expected = model(kjt).detach()
    same = quantize_embeddings(model, dtype=torch.qint8, inplace=True, per_table_weight_dtype={"t1": torch.float16})  # fmt: skip
    assert same is model and isinstance(model.sparse[0], QuantEBC)
    data_types = {c.name: c.data_type for c in model.sparse[0].embedding_bag_configs()}
    assert data_types == {"t0": DataType.INT8, "t1": DataType.FP16, "t2": DataType.INT8}
    torch.testing.assert_close(model(kjt).detach(), expected, rtol=0.02, atol=0.02)
    half = quantize_embeddings(_float_ebc(), dtype=torch.qint8, inplace=False, output_dtype=torch.half)  # fmt: skip
    assert half(kjt).values().dtype == torch.float16


def test_uint8_is_uint8_everywhere_and_served_as_int8():
    """One `dtype_to_data_type` (TorchRec's mapping): uint8 is UINT8, the int8 family INT8; a
    table asked for in uint8 is served in INT8's rows, as FBGEMM stores both (SparseType.INT8)."""
    from shardkit.modules.embedding_configs import dtype_to_data_type

    assert dtype_to_data_type(torch.uint8) is DataType.UINT8
    assert {dtype_to_data_type(d) for d in (torch.int8, torch.qint8, torch.quint8)} == {DataType.INT8}  # fmt: skip
    kjt = _batch(1, weighted=False)
    as_uint8 = quantize_embeddings(_float_ebc(), dtype=torch.uint8, inplace=False)
    as_qint8 = quantize_embeddings(_float_ebc(), dtype=torch.qint8, inplace=False)
    assert {c.data_type for c in as_uint8.embedding_bag_configs()} == {DataType.INT8}
    torch.testing.assert_close(as_uint8(kjt).values(), as_qint8(kjt).values(), rtol=0, atol=0)


def test_errors_name_the_table_and_what_works():
    odd = _float_ebc(dims=(7, 4))
    with pytest.raises(ValueError, match="table 't0': INT4 packs 2 values a byte, so embedding_dim must be a multiple of 2 \\(got 7\\); use INT8 or FP16"):  # fmt: skip
        quantize_embeddings(odd, dtype=torch.quint4x2, inplace=False)
    with pytest.raises(ValueError, match="table 't0': INT4 packs 2 values a byte"):
        quantize_table_weights(odd.state_dict(), DataType.INT4)
    with pytest.raises(ValueError, match="table 't0': data type BF16 cannot be served quantized"):
        quantize_embeddings(_float_ebc(), dtype=torch.bfloat16, inplace=False)
    with pytest.raises(ValueError, match=r"table 't0': data type INT32 cannot be served quantized; use one of FP32, FP16, INT8, INT4, INT2"):  # fmt: skip
        quantize_embeddings(_float_ebc(), dtype=torch.int32, inplace=False)
    tables = _tables()
    with pytest.raises(ValueError, match=r"served on CPU .* got device cuda"):
        QuantEBC(tables, is_weighted=False, device="cuda")
    with pytest.raises(ValueError, match=r"quantized EmbeddingCollection\(need_indices=True\): shardkit's JaggedTensor weights are floats, not ids; leave need_indices False"):  # fmt: skip
        QuantEC([EmbeddingConfig(name="s", embedding_dim=4, num_embeddings=7, feature_names=["s"])], need_indices=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"needs module\.qconfig"):
        QuantEBC.from_float(_float_ebc())
    with pytest.raises(ValueError, match=r"table 't1': quantized weights are torch.float32 \[7, 8\] but FP32 rows of dim 4 are torch.float32 \[7, 4\]"):  # fmt: skip
        QuantEBC(tables, is_weighted=False,
                 table_name_to_quantized_weights={t.name: (torch.zeros(t.num_embeddings, 8), None) for t in tables})  # fmt: skip
    quantized = quantize_embeddings(_float_ebc(), dtype=torch.qint8, inplace=False)
    bad = KeyedJaggedTensor(keys=["a", "b", "c", "d"], values=torch.tensor([7, 4]), lengths=torch.tensor([0, 0, 1, 1]))  # fmt: skip
    with pytest.raises(ValueError, match=r"feature 'c': id 7 is outside its table of 7 rows"):
        quantized(bad)
    with pytest.raises(ValueError, match=r"features \['d'\] of the quantized tables are not keys"):
        quantized(KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.tensor([1]), lengths=torch.tensor([1, 0, 0])))  # fmt: skip
    vbe = KeyedJaggedTensor(keys=["a", "b", "c", "d"], values=torch.tensor([1, 2, 3, 4, 0]),
                            lengths=torch.tensor([1, 1, 1, 1, 1]),
                            stride_per_key_per_rank=[[1], [2], [1], [1]])  # fmt: skip
    with pytest.raises(ValueError, match=r"one batch size for all keys; .* \(\[1, 2, 1, 1\]\)"):
        quantized(vbe)
    weighted = quantize_embeddings(_float_ebc(weighted=True), dtype=torch.qint8, inplace=False)
    with pytest.raises(ValueError, match="weighted but the KJT has no weights"):
        weighted(_batch(0, weighted=False))


def test_position_weighted_and_managed_collision_models_quantize():
    """Their inner EmbeddingBagCollection is swapped; the processors and remappers stay."""
    from shardkit.modules.feature_processor_ import PositionWeightedModuleCollection
    from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
    from shardkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from shardkit.modules.mc_modules import (
        LFU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )

    weighted = _float_ebc(weighted=True)
    fp_ebc = FeatureProcessedEmbeddingBagCollection(weighted, PositionWeightedModuleCollection({"a": 4, "b": 4}))  # fmt: skip
    kjt = _batch(2, weighted=False)
    expected = fp_ebc(kjt).values().detach()
    quantize_embeddings(fp_ebc, dtype=torch.qint8, inplace=True)
    assert isinstance(fp_ebc._embedding_bag_collection, QuantEBC)
    torch.testing.assert_close(fp_ebc(kjt).values().detach(), expected, rtol=0.02, atol=0.05)

    tables = _tables()
    modules = {
        t.name: MCHManagedCollisionModule(t.num_embeddings, "cpu", LFU_EvictionPolicy(), 1)
        for t in tables
    }
    mcc = ManagedCollisionCollection(modules, tables)
    mc_ebc = ManagedCollisionEmbeddingBagCollection(_float_ebc(), mcc)
    raw = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values() * 1_000_003 + 2**40, lengths=kjt.lengths())  # fmt: skip
    mc_ebc(raw)  # training: the ids take rows
    mc_ebc.eval()
    expected = mc_ebc(raw)[0].values().detach()
    quantize_embeddings(mc_ebc, dtype=torch.qint8, inplace=True)
    assert isinstance(mc_ebc._embedding_module, QuantEBC)
    torch.testing.assert_close(mc_ebc(raw)[0].values(), expected, rtol=0.02, atol=0.05)
    mc_ebc.train()  # a quantized table cannot take new ids
    with pytest.raises(ValueError, match=r"ids were evicted, but its embedding module \(EmbeddingBagCollection\) cannot reset rows"):  # fmt: skip
        mc_ebc(KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values() + 7, lengths=kjt.lengths()))
