"""TorchRec's small helpers around position weights, managed collision and quantized serving,
at TorchRec's paths."""

from __future__ import annotations

import torch

from shardkit import KeyedJaggedTensor
from shardkit.inference.modules import (
    DEFAULT_QUANT_MAPPING,
    trim_torch_package_prefix_from_typename,
)
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.modules.feature_processor_ import get_stride_per_key_per_rank, get_weights_list
from shardkit.modules.mc_modules import (
    LFU_EvictionPolicy,
    MCHManagedCollisionModule,
    apply_mc_method_to_jt_dict,
)
from shardkit.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection
from shardkit.quant.embedding_modules import for_each_module_of_type_do
from shardkit.sparse import JaggedTensor


def test_get_weights_list_gathers_position_weights_and_ones_elsewhere():
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.arange(5), lengths=torch.tensor([2, 1, 2, 0])
    )
    positions = torch.tensor([0, 1, 0, 0, 1])
    weights = get_weights_list(positions, kjt, {"a": torch.tensor([0.5, 2.0])})
    torch.testing.assert_close(weights, torch.tensor([0.5, 2.0, 0.5, 1.0, 1.0]))
    assert get_stride_per_key_per_rank(kjt) is None


def test_apply_mc_method_to_jt_dict_calls_the_method():
    module = MCHManagedCollisionModule(4, "cpu", LFU_EvictionPolicy(), 1).eval()
    out = apply_mc_method_to_jt_dict(
        module, "remap", {"t": JaggedTensor(values=torch.tensor([7, 9]), lengths=torch.tensor([2]))}
    )
    torch.testing.assert_close(out["t"].values(), torch.tensor([3, 3]))  # no ids kept yet


def test_for_each_module_of_type_and_the_quant_mapping():
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=3, feature_names=["f"])
        ]
    )
    seen = []
    for_each_module_of_type_do(torch.nn.Sequential(ebc), [EmbeddingBagCollection], seen.append)
    assert seen == [ebc]
    assert DEFAULT_QUANT_MAPPING[torch.typename(ebc)] is QuantEmbeddingBagCollection
    assert trim_torch_package_prefix_from_typename("<torch_package_0>.a.B") == "a.B"
    assert trim_torch_package_prefix_from_typename("a.B") == "a.B"
