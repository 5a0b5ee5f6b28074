"""What TorchRec programs call in ``torchrec.distributed`` beyond DMP (issue 12, part B), each
against the unsharded module or TorchRec's documented behaviour: the comm helpers on two
"hosts", the composable ``shard``/``shard_modules``, the in-backward markers on table shards,
the eval pipeline (forward only), awaitables, and the refusals (quantized comms, FBGEMM
kernel settings)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from shardkit import EmbeddingBagCollection
from shardkit.datasets.utils import Batch
from shardkit.distributed import EvalPipelineSparseDist
from shardkit.distributed.comm import (
    get_group_rank,
    get_local_rank,
    get_local_size,
    get_num_groups,
    intra_and_cross_node_pg,
)
from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
from shardkit.distributed.fbgemm_qcomm_codec import (
    CommType,
    QCommsConfig,
    get_qcomm_codecs_registry,
)
from shardkit.distributed.model_parallel import DistributedModelParallel
from shardkit.distributed.shard import shard, shard_modules
from shardkit.distributed.sharding_plan import row_wise
from shardkit.distributed.types import (
    CacheParams,
    LazyAwaitable,
    LazyNoWait,
    NoWait,
    ParameterSharding,
)
from shardkit.models import DLRMTrain
from shardkit.optim.optimizers import in_backward_optimizer_filter
from tests.sharding.common import configs, dlrm, dlrm_batch, global_batch, local_part


def _comm_on_two_hosts(rank: int, world_size: int) -> None:
    assert (get_local_size(), get_local_rank(), get_group_rank(), get_num_groups()) == (
        2, rank % 2, rank // 2, 2,
    )  # fmt: skip
    intra, cross = intra_and_cross_node_pg()
    mine = torch.tensor([float(rank)])
    dist.all_reduce(mine, group=intra)
    assert mine.item() == {0: 1.0, 1: 5.0}[rank // 2]  # hosts [0, 1] and [2, 3]
    mine = torch.tensor([float(rank)])
    dist.all_reduce(mine, group=cross)
    assert mine.item() == {0: 2.0, 1: 4.0}[rank % 2]  # local index 0: [0, 2]; 1: [1, 3]
    assert intra_and_cross_node_pg() == (intra, cross)  # made once per job


def test_comm_helpers_on_four_ranks_in_two_hosts(run_ranks):
    run_ranks(_comm_on_two_hosts, 4, local_world_size=2)


class _Holder(nn.Module):
    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.ebc = ebc
        self.dense = nn.Linear(2, 2)


def _composable_shard(rank: int, world_size: int) -> None:
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=configs())
    batch = local_part(global_batch(3, 4 * world_size, weighted=False), rank, world_size)
    expected = reference(batch).values()

    holder = shard_modules(_Holder(copy.deepcopy(reference)))
    assert type(holder.ebc).__name__ == "ShardedEmbeddingBagCollection"
    assert isinstance(holder.dense, nn.Linear)  # the rest stays as it is (no DDP)
    torch.testing.assert_close(holder.ebc(batch).values(), expected)

    one = shard(copy.deepcopy(reference), row_wise())
    torch.testing.assert_close(one(batch).values(), expected)

    # TorchRec's marker: in_backward_optimizer_filter leaves table shards to the fused optimizer
    tables = dict(holder.ebc.named_parameters())
    assert tables and all(hasattr(p, "_in_backward_optimizers") for p in tables.values())
    assert sorted(dict(in_backward_optimizer_filter(holder.named_parameters()))) == [
        "dense.bias", "dense.weight",
    ]  # fmt: skip


def test_shard_and_shard_modules_give_the_unsharded_outputs(run_ranks):
    run_ranks(_composable_shard, 2)


def _eval_pipeline(rank: int, world_size: int) -> None:
    torch.manual_seed(0)
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}  # shards too
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    batches = []
    for step in range(3):
        dense, sparse, labels = dlrm_batch(step, 4 * world_size)
        local = slice(rank * 4, (rank + 1) * 4)
        batches.append(Batch(dense[local], local_part(sparse, rank, world_size), labels[local]))
    assert model.training  # TorchRec's eval pipeline runs forward only even so
    pipeline = EvalPipelineSparseDist(model, optimizer, torch.device("cpu"))
    data, outputs = iter(batches), []
    while True:
        try:
            outputs.append(pipeline.progress(data))
        except StopIteration:
            break
    assert len(outputs) == 3
    assert len(before) > 4
    for name, value in model.named_parameters():
        torch.testing.assert_close(value, before[name], msg=name)
    with torch.no_grad():
        for batch, (_, logits, labels) in zip(batches, outputs):
            torch.testing.assert_close(logits, model(batch)[1][1])
            torch.testing.assert_close(labels, batch.labels)


def test_the_eval_pipeline_runs_forward_only_and_leaves_the_model_as_it_was(run_ranks):
    run_ranks(_eval_pipeline, 2)


def test_lazy_awaitables_wait_on_first_use_and_apply_their_callbacks():
    pending = LazyNoWait(torch.ones(2))
    pending.callbacks.append(lambda t: t * 3)
    assert isinstance(pending, LazyAwaitable)
    torch.testing.assert_close(torch.sum(pending), torch.tensor(6.0))
    torch.testing.assert_close(pending + 1, torch.tensor([4.0, 4.0]))
    ready = NoWait(5)
    ready.callbacks.append(lambda x: x + 1)
    assert ready.wait() == 6


def test_quantized_comm_codecs_are_accepted_fbgemm_mx4_refused_by_name():
    """The casts and the FP8/INT8 row-wise codecs go to the sharded collections
    (tests/sharding/test_qcomm.py runs them); FBGEMM's MX4 is refused by name with what to use
    instead."""
    registry = get_qcomm_codecs_registry(
        QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16),
        device=torch.device("cpu"),
    )
    sharder = EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)
    codecs = sharder.qcomm_codecs_registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    assert codecs.forward.quantized_dtype == torch.float16
    assert codecs.backward.quantized_dtype == torch.bfloat16  # on the CPU too (gloo carries it)
    for precision in (CommType.FP8, CommType.INT8):  # row-wise, on uint8 rows
        codecs = get_qcomm_codecs_registry(QCommsConfig(forward_precision=precision))
        assert codecs["POOLED_EMBEDDINGS_ALL_TO_ALL"].forward.quantized_dtype == torch.uint8
    with pytest.raises(ValueError, match=r"forward_precision=MX4: MX4 comms are an FBGEMM "
                       r"kernel.*use CommType.INT8 or CommType.FP8"):  # fmt: skip
        get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.MX4))
    fp32 = QCommsConfig(forward_precision=CommType.FP32, backward_precision=CommType.FP32)
    assert get_qcomm_codecs_registry(fp32) is None
    assert EmbeddingBagCollectionSharder(qcomm_codecs_registry=None).qcomm_codecs_registry is None


def test_fbgemm_kernel_settings_on_a_parameter_sharding_are_refused_by_name():
    sharding = ParameterSharding(  # built (plans are mutable), refused where applied
        sharding_type="table_wise",
        compute_kernel="fused",
        ranks=[0],
        cache_params=CacheParams(load_factor=0.2),
    )
    with pytest.raises(ValueError, match=r"table 't': cache_params=.*UVM caching is an FBGEMM"):
        sharding.validate("t")
    with pytest.raises(ValueError, match=r"'fused_uvm_caching'.*UVM"):
        ParameterSharding(sharding_type="table_wise", compute_kernel="fused_uvm_caching")


def test_an_unknown_torchrec_argument_is_an_error_naming_it():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'no_such_option'"):
        EmbeddingBagCollectionSharder(no_such_option=1)  # type: ignore[call-arg]
