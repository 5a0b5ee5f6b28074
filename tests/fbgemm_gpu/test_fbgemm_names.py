"""The FBGEMM names TorchRec programs import work at ``shardkit.fbgemm_gpu`` (after the README's
rewrite ``fbgemm_gpu`` -> ``shardkit.fbgemm_gpu``), or are refused with what to use."""

from __future__ import annotations

import pytest
import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops import OptimType
from shardkit.optim import EmbOptimType as ShardkitEmbOptimType


def test_emb_optim_type_picks_the_fused_optimizer():
    assert EmbOptimType is ShardkitEmbOptimType and OptimType is EmbOptimType
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=2, num_embeddings=4, feature_names=["f"])],
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1},
    )  # fmt: skip
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    before = ebc.embedding_bags.t.weight.detach().clone()
    ebc(kjt).values().sum().backward()
    changed = (ebc.embedding_bags.t.weight.detach() != before).any(dim=1)
    assert changed.tolist() == [False, True, False, False]
    assert EmbOptimType.ROWWISE_ADAGRAD is EmbOptimType.EXACT_ROWWISE_ADAGRAD
    assert EmbOptimType.SGD is EmbOptimType.EXACT_SGD
    with pytest.raises(AttributeError, match=r"EmbOptimType.MADGRAD: an FBGEMM-only fused optim"):
        _ = EmbOptimType.MADGRAD
    assert EmbOptimType.LAMB.value == "lamb"  # FBGEMM's value


def test_sparse_type():
    assert SparseType.FP16.as_dtype() == torch.float16 and SparseType.INT4.bit_rate() == 4
    assert SparseType.from_dtype(torch.bfloat16) is SparseType.BF16
    assert SparseType.INT8.as_dtype() == torch.uint8 and not SparseType.INT8.is_float()
    with pytest.raises(ValueError, match=r"no SparseType for torch.int64"):
        SparseType.from_dtype(torch.int64)
