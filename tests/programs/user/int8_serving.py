"""Train with DMP, quantize to INT8 for serving, and serve from a fresh Python process (issue 27):
TorchRec's inference docs' flow. Run: torchrun --nproc-per-node 2 int8_serving.py OUT

Two ranks train an EmbeddingBagCollection row-wise; rank 0 gathers the tables, quantizes the
model with quantize_embeddings(dtype=torch.qint8), saves its state dict, and a new `python`
process (as a serving job would be) builds the quantized model, loads it and answers a batch.
"""

import json
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.inference.modules import quantize_embeddings
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

SERVE = """
import json, sys, torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.inference.modules import quantize_embeddings
tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=64,
                             feature_names=[f"f{i}"]) for i in range(2)]
model = torch.nn.Sequential(EmbeddingBagCollection(tables=tables))
model = quantize_embeddings(model, dtype=torch.qint8, inplace=True)
model.load_state_dict(torch.load(sys.argv[1]))
kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.arange(0, 64, 3),
                        lengths=torch.tensor([3, 4, 0, 4, 2, 3, 3, 3]))
print(json.dumps(model(kjt).values().tolist()))
"""

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=64,
                             feature_names=[f"f{i}"]) for i in range(2)]  # fmt: skip
ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.5})
plan = construct_module_sharding_plan(
    ebc, per_param_sharding={"t0": row_wise(), "t1": row_wise()},
    local_size=world, world_size=world, device_type="cpu",
)  # fmt: skip
model = DistributedModelParallel(
    ebc, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
    plan=ShardingPlan({"": plan}), sharders=[EmbeddingBagCollectionSharder()],
)  # fmt: skip
g = torch.Generator().manual_seed(5)
FULL = {f"embedding_bags.t{i}.weight": torch.rand(64, 16, generator=g) - 0.5 for i in range(2)}
with torch.no_grad():
    for key, value in model.state_dict().items():
        for shard in value.local_shards():
            (r, c), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(FULL[key.removeprefix("module.")][r : r + nr, c : c + nc])

losses = []
for step in range(5):
    gen = torch.Generator().manual_seed(step)
    lengths = torch.randint(1, 4, (2 * 2,), generator=gen)
    kjt = KeyedJaggedTensor(keys=["f0", "f1"],
                            values=torch.randint(0, 64, (int(lengths.sum()),), generator=gen),
                            lengths=lengths)  # fmt: skip
    loss = (model(kjt).values() ** 2).mean()  # every rank its own 2 examples
    loss.backward()
    losses.append(loss.item())

full = {}
for key, value in model.state_dict().items():
    assert isinstance(value, ShardedTensor)
    out = torch.empty(value.size()) if rank == 0 else None
    value.gather(dst=0, out=out)
    full[key.removeprefix("module.")] = out

if rank == 0:
    trained = torch.nn.Sequential(EmbeddingBagCollection(tables=tables))
    trained.load_state_dict({f"0.{k}": v for k, v in full.items()})
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.arange(0, 64, 3),
                            lengths=torch.tensor([3, 4, 0, 4, 2, 3, 3, 3]))  # fmt: skip
    float_out = trained(kjt).values()
    quantized = quantize_embeddings(trained, dtype=torch.qint8, inplace=False)
    local_out = quantized(kjt).values()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/quantized.pt"
        torch.save({k: v.clone() for k, v in quantized.state_dict().items()}, path)
        served = subprocess.run([sys.executable, "-c", SERVE, path], capture_output=True,
                                text=True, check=True)  # fmt: skip
    served_out = torch.tensor(json.loads(served.stdout.strip().splitlines()[-1]))
    figures = {
        "losses": losses,
        "float_outputs": float_out.tolist(),
        "served_outputs": served_out.tolist(),
        "served_equals_in_process": bool(torch.equal(served_out, local_out)),
        "int8_max_error": float((served_out - float_out).abs().max()),
        "state_dict_shapes": json.dumps(
            {k: list(v.shape) for k, v in quantized.state_dict().items()}
        ),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
