"""TorchRec's quantized collections with processors or managed collision in front
(``torchrec.quant.embedding_modules``), and its quantization switches (``quant_prep_*``)."""

from __future__ import annotations

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.inference.modules import quantize_inference_model
from shardkit.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
)
from shardkit.modules.embedding_configs import QuantConfig
from shardkit.modules.feature_processor_ import PositionWeightedModuleCollection
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from shardkit.modules.mc_modules import (
    LFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from shardkit.quant import EmbeddingBagCollection as QuantEBC
from shardkit.quant import embedding_modules as qem
from tests.compat.peers import run_in_torchrec

KEYS = ["a", "b"]
QINT8 = QuantConfig(activation=lambda: torch.empty(0), weight=lambda: torch.empty(0, dtype=torch.int8))  # fmt: skip


def _bags(weighted: bool = False) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(is_weighted=weighted, tables=[
        EmbeddingBagConfig(name=f"t_{k}", embedding_dim=8, num_embeddings=16, feature_names=[k])
        for k in KEYS
    ])  # fmt: skip


def _kjt(values: list[int], lengths: list[int]) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=KEYS, values=torch.tensor(values), lengths=torch.tensor(lengths))


def test_feature_processed_collection_is_the_float_one_quantized():
    fp = FeatureProcessedEmbeddingBagCollection(
        _bags(weighted=True), PositionWeightedModuleCollection({"a": 4, "b": 4})
    )
    with torch.no_grad():
        for p in fp._feature_processors.parameters():
            p.uniform_(0.5, 2.0)  # position weights that matter
    kjt = _kjt([1, 2, 3, 4, 5, 6], [3, 0, 1, 2])
    expected = fp(kjt).values().detach()
    fp.qconfig = QINT8
    quantized = qem.FeatureProcessedEmbeddingBagCollection.from_float(fp)
    assert quantized.feature_processor is fp.split()[0]
    got = quantized(kjt).values()
    torch.testing.assert_close(got, expected, rtol=0.02, atol=0.05)
    unweighted = QuantEBC.from_float(_with_qconfig(fp._embedding_bag_collection))
    ones = KeyedJaggedTensor(keys=KEYS, values=kjt.values(), lengths=kjt.lengths(),
                             weights=torch.ones(6))  # fmt: skip
    assert not torch.allclose(unweighted(ones).values(), got, atol=0.05)  # the weights count
    with pytest.raises(
        ValueError, match=r"needs feature_processor; without one use shardkit.quant"
    ):
        qem.FeatureProcessedEmbeddingBagCollection(quantized.embedding_bag_configs(), True)


def _with_qconfig(module: torch.nn.Module) -> torch.nn.Module:
    module.qconfig = QINT8
    return module


def _mcc(configs) -> ManagedCollisionCollection:
    modules = {c.name: MCHManagedCollisionModule(c.num_embeddings, "cpu", LFU_EvictionPolicy(), 1)
               for c in configs}  # fmt: skip
    return ManagedCollisionCollection(modules, configs)


RAW = _kjt([10**12 + 5, 7 * 10**11, 10**12 + 5, 3, 2**40], [2, 1, 1, 1])
UNSEEN = _kjt([99, 10**13, 17, 10**12 + 5], [1, 1, 1, 1])


@pytest.mark.parametrize("bags", [True, False])
def test_managed_collision_collections_remap_then_look_up_quantized(bags):
    if bags:
        tables = _bags()
        mc = ManagedCollisionEmbeddingBagCollection(tables, _mcc(tables.embedding_bag_configs()))
        cls = qem.QuantManagedCollisionEmbeddingBagCollection
    else:
        torch.manual_seed(0)
        configs = [EmbeddingConfig(name=f"t_{k}", embedding_dim=8, num_embeddings=16,
                                   feature_names=[k]) for k in KEYS]  # fmt: skip
        mc = ManagedCollisionEmbeddingCollection(EmbeddingCollection(tables=configs), _mcc(configs))
        cls = qem.QuantManagedCollisionEmbeddingCollection
    mc(RAW)  # training: these ids take rows
    mc.eval()
    quantized = cls.from_float(_with_qconfig(mc))
    quantized.train()  # the remapper stays in eval: serving never evicts
    for kjt in (RAW, UNSEEN):
        expected, _ = mc(kjt)
        got, remapped = quantized(kjt)
        assert remapped.values().max() < 16
        if bags:
            torch.testing.assert_close(got.values(), expected.values().detach(), rtol=0.02, atol=0.05)  # fmt: skip
        else:
            for key in KEYS:
                torch.testing.assert_close(got[key].values(), expected[key].values().detach(), rtol=0.02, atol=0.05)  # fmt: skip
    assert not quantized._managed_collision_collection.training
    with pytest.raises(ValueError, match=r"the managed collision collection's tables \['t_a'\] "
                       r"are not the collection's \['t_a', 't_b'\]"):  # fmt: skip
        configs = list(quantized._configs)
        qem.QuantManagedCollisionEmbeddingBagCollection(
            configs if bags else _bags().embedding_bag_configs(),
            False,
            managed_collision_collection=_mcc(configs[:1]),
        )


def test_quant_prep_switches_reach_the_quantized_module_and_change_no_output():
    model = torch.nn.ModuleDict({"x": _bags(), "y": torch.nn.Linear(2, 2)})
    kjt = _kjt([1, 2, 3], [1, 1, 0, 1])
    expected = quantize_inference_model(_bags_model())["x"](kjt).values()
    qem.quant_prep_customize_row_alignment(model, [EmbeddingBagCollection], 32)
    qem.quant_prep_enable_register_tbes(model, [EmbeddingBagCollection])
    assert getattr(model["x"], qem.MODULE_ATTR_ROW_ALIGNMENT_INT) == 32
    assert not hasattr(model["y"], qem.MODULE_ATTR_ROW_ALIGNMENT_INT)  # only the types given
    quantize_inference_model(model)
    assert model["x"].layout == {"register_tbes": True, "row_alignment": 32,
                                 "cache_features_order": True}  # fmt: skip
    torch.testing.assert_close(model["x"](kjt).values(), expected, rtol=0, atol=0)
    assert qem.DEFAULT_ROW_ALIGNMENT == 16


def _bags_model() -> torch.nn.Module:
    return torch.nn.ModuleDict({"x": _bags()})


@pytest.mark.parametrize(
    ("attr", "value", "pattern"),
    [
        (qem.MODULE_ATTR_ROW_ALIGNMENT_INT, 0, r"row_alignment must be a positive number of bytes "
         r"\(FBGEMM's default 16\), got 0"),
        ("__emb_name_to_num_rows_post_pruning", {"t_a": 4}, r"row pruning \(MODULE_ATTR_EMB_"
         r"CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT\) is not supported"),
    ],
)  # fmt: skip
def test_switches_that_would_change_storage_are_refused(attr, value, pattern):
    model = _bags_model()
    setattr(model["x"], attr, value)  # as TorchRec's quant_prep_* (or a user) would
    with pytest.raises(ValueError, match=pattern):
        quantize_inference_model(model)


def test_constants_are_torchrecs(tmp_path):
    names = [n for n in qem.__all__ if n.isupper()]
    theirs = run_in_torchrec(
        "import torchrec.quant.embedding_modules as m\n"
        "outputs['values'] = {n: getattr(m, n) for n in inputs['names']}\n",
        {"names": names},
        tmp_path,
    )
    assert theirs["values"] == {n: getattr(qem, n) for n in names}
