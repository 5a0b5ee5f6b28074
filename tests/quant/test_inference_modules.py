"""TorchRec's ``torchrec.inference.modules`` serving names: quantize a small DLRM with
`quantize_inference_model`, serve it through a `PredictModule` (dense part in float16 with
`quantize_dense`), and move its quantized tables by name between models."""

from __future__ import annotations

import json

import pytest
import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.inference.modules import (
    FEATURE_PROCESSED_EBC_TYPE,
    BatchingMetadata,
    PredictFactory,
    PredictModule,
    QualNameMetadata,
    assign_weights_to_tbe,
    get_table_to_weights_from_tbe,
    quantize_dense,
    quantize_feature,
    quantize_inference_model,
)
from shardkit.models.dlrm import DLRM
from shardkit.modules import DataType, EmbeddingBagCollectionInterface
from shardkit.modules.feature_processor_ import PositionWeightedModuleCollection
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.quant import EmbeddingBagCollection as QuantEBC
from shardkit.quant.embedding_modules import FeatureProcessedEmbeddingBagCollection as QuantFPEBC

KEYS = ["a", "b"]


def _dlrm(seed: int) -> DLRM:
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t_{k}", embedding_dim=8, num_embeddings=20, feature_names=[k])
        for k in KEYS
    ])  # fmt: skip
    return DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[8], over_arch_layer_sizes=[4, 1])


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (2 * 4,), generator=g)
    return {
        "float_features": torch.randn(4, 3, generator=g),
        "values": torch.randint(0, 20, (int(lengths.sum()),), generator=g),
        "lengths": lengths,
    }


class _DLRMPredict(PredictModule):
    def predict_forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        kjt = KeyedJaggedTensor(keys=KEYS, values=batch["values"], lengths=batch["lengths"])
        return {"score": self.predict_module(batch["float_features"], kjt).float()}


class _Factory(PredictFactory):
    def create_predict_module(self) -> torch.nn.Module:
        model = quantize_inference_model(_dlrm(0), per_table_weight_dtype={"t_b": torch.float32})
        return quantize_dense(_DLRMPredict(model, device="cpu"), torch.half)

    def batching_metadata(self) -> dict[str, BatchingMetadata]:
        return {"float_features": BatchingMetadata("dense", "cpu", []),
                "id_list_features": BatchingMetadata("sparse", "cpu", ["lengths"])}  # fmt: skip

    def result_metadata(self) -> str:
        return "dict_of_tensor"

    def run_weights_independent_tranformations(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def run_weights_dependent_transformations(self, module: torch.nn.Module) -> torch.nn.Module:
        return module


def test_a_quantized_dlrm_serves_through_a_predict_module():
    model = _dlrm(0)
    batch = _batch(1)
    with torch.no_grad():
        kjt = KeyedJaggedTensor(keys=KEYS, values=batch["values"], lengths=batch["lengths"])
        expected = model(batch["float_features"], kjt)
    factory = _Factory()
    served = factory.create_predict_module()
    ebc = served.predict_module.sparse_arch.embedding_bag_collection
    assert isinstance(ebc, QuantEBC) and isinstance(ebc, EmbeddingBagCollectionInterface)
    assert [c.data_type for c in ebc.embedding_bag_configs()] == [DataType.INT8, DataType.FP32]
    assert ebc.embedding_bags["t_b"].weight.dtype == torch.float32  # tables stay as stored
    dense = [served.predict_module.dense_arch, served.predict_module.over_arch]
    assert {p.dtype for m in dense for p in m.parameters()} == {torch.half}
    assert not served.predict_module.training
    score = served(batch)["score"]
    assert score.shape == expected.shape and not score.requires_grad
    torch.testing.assert_close(score, expected, rtol=0.02, atol=0.02)  # int8 tables, fp16 MLPs
    assert "_module." not in "".join(served.state_dict())
    assert json.loads(factory.batching_metadata_json())["id_list_features"] == {
        "type": "sparse", "device": "cpu", "pinned": ["lengths"]}  # fmt: skip
    assert factory.qualname_metadata_json() == "{}"
    assert QualNameMetadata(need_preproc=True).need_preproc


def test_quantize_dense_and_feature_as_torchrec():
    x, ids = torch.randn(2, dtype=torch.float64), torch.tensor([1, 2])
    assert [t.dtype for t in quantize_feature(torch.nn.Identity(), (x, ids, "s"))[:2]] == [
        torch.half, torch.long]  # fmt: skip
    with pytest.raises(ValueError, match=r"quantize_dense lowers dense modules to torch.half only"
                       r", got torch.int8; quantize nn.Linear layers"):  # fmt: skip
        quantize_dense(_DLRMPredict(_dlrm(0), device="cpu"), torch.int8)


def test_per_table_and_feature_processed_dtypes():
    torch.manual_seed(0)
    configs = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=8, num_embeddings=20,
                                  feature_names=[k]) for k in KEYS]  # fmt: skip
    fp_ebc = FeatureProcessedEmbeddingBagCollection(
        EmbeddingBagCollection(tables=configs, is_weighted=True),
        PositionWeightedModuleCollection({"a": 4, "b": 4}),
    )
    model = torch.nn.ModuleDict({"fp": fp_ebc, "plain": _dlrm(1).sparse_arch})
    kjt = KeyedJaggedTensor(keys=KEYS, values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 0, 2, 0]))  # fmt: skip
    expected = fp_ebc(kjt).values().detach()
    quantize_inference_model(model, fp_weight_dtype=torch.float16,
                             per_table_weight_dtype={"t_b": torch.quint4x2})  # fmt: skip
    quantized = model["fp"]
    assert type(quantized) is QuantFPEBC and quantized.feature_processor is not None
    fp_types = {c.name: c.data_type for c in quantized.embedding_bag_configs()}
    assert fp_types == {"t_a": DataType.FP16, "t_b": DataType.INT4}
    plain = model["plain"].embedding_bag_collection.embedding_bag_configs()
    assert {c.name: c.data_type for c in plain} == {"t_a": DataType.INT8, "t_b": DataType.INT4}
    torch.testing.assert_close(quantized(kjt).values(), expected, rtol=0.05, atol=0.1)
    assert FEATURE_PROCESSED_EBC_TYPE.endswith(".FeatureProcessedEmbeddingBagCollection")


def test_table_weights_move_between_models_by_name():
    source, target = quantize_inference_model(_dlrm(0)), quantize_inference_model(_dlrm(5))
    batch = _batch(2)
    kjt = KeyedJaggedTensor(keys=KEYS, values=batch["values"], lengths=batch["lengths"])
    weights = get_table_to_weights_from_tbe(source)
    assert sorted(weights) == ["t_a", "t_b"]
    codes, scale_bias = weights["t_a"]
    assert codes.shape == (20, 8) and scale_bias.shape == (20, 8)  # INT8: float32 scale, bias
    before = target.sparse_arch(kjt)
    assign_weights_to_tbe(target, weights)
    after = target.sparse_arch(kjt)
    torch.testing.assert_close(after, source.sparse_arch(kjt), rtol=0, atol=0)
    assert not torch.equal(before, after)
    with pytest.raises(ValueError, match=r"no weights for quantized table 't_a'; got \['t_b'\]"):
        assign_weights_to_tbe(target, {"t_b": weights["t_b"]})
    with pytest.raises(ValueError, match=r"weights of table 't_a' are \(20, 8\) torch.uint8 "
                       r"\(codes and scale/bias side by side\); the table stores \(20, 16\)"):  # fmt: skip
        assign_weights_to_tbe(target, {**weights, "t_a": (codes, None)})
