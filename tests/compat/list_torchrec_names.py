"""Regenerate tests/compat/torchrec_names.txt from TorchRec 1.8 and FBGEMM as installed:

    ~/.cache/shardkit-peers/venv/bin/python tests/compat/list_torchrec_names.py

The list holds facts (the public names of TorchRec's user-facing modules); the marks on its lines
("| refused: ..." / "| pending: ...") are ours and survive regeneration. A module's public names
are its ``__all__``; without one, the public classes and functions defined in it (for a package:
re-exported from TorchRec) and its UPPER_CASE constants of plain values. Every TorchRec module
found must be either listed in `MODULES` or left out in `LEFT_OUT` with a reason: the choice is
deliberate, and a new TorchRec release that adds a module fails here until it is made.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import pkgutil
import re
import sys
import warnings
from pathlib import Path

LIST = Path(__file__).with_name("torchrec_names.txt")

MODULES = [
    "torchrec",
    "torchrec.streamable",
    "torchrec.tensor_types",
    "torchrec.sparse.jagged_tensor",
    "torchrec.modules.embedding_configs",
    "torchrec.modules.embedding_modules",
    "torchrec.modules.mlp",
    "torchrec.modules.crossnet",
    "torchrec.modules.deepfm",
    "torchrec.modules.activation",
    "torchrec.modules.utils",
    "torchrec.modules.feature_processor_",
    "torchrec.modules.fp_embedding_modules",
    "torchrec.modules.mc_modules",
    "torchrec.modules.mc_embedding_modules",
    "torchrec.models.dlrm",
    "torchrec.models.deepfm",
    "torchrec.datasets.utils",
    "torchrec.datasets.random",
    "torchrec.datasets.criteo",
    "torchrec.datasets.movielens",
    "torchrec.optim",
    "torchrec.optim.keyed",
    "torchrec.optim.optimizers",
    "torchrec.optim.rowwise_adagrad",
    "torchrec.optim.apply_optimizer_in_backward",
    "torchrec.optim.warmup",
    "torchrec.optim.clipping",
    "torchrec.optim.fused",
    "torchrec.metrics.metric_module",
    "torchrec.metrics.metrics_config",
    "torchrec.metrics.metrics_namespace",
    "torchrec.metrics.rec_metric",
    "torchrec.metrics.auc",
    "torchrec.metrics.ne",
    "torchrec.metrics.calibration",
    "torchrec.metrics.ctr",
    "torchrec.metrics.accuracy",
    "torchrec.metrics.mse",
    "torchrec.metrics.throughput",
    "torchrec.distributed",
    "torchrec.distributed.types",
    "torchrec.distributed.embedding_types",
    "torchrec.distributed.embeddingbag",
    "torchrec.distributed.embedding",
    "torchrec.distributed.model_parallel",
    "torchrec.distributed.train_pipeline",
    "torchrec.distributed.planner",
    "torchrec.distributed.planner.types",
    "torchrec.distributed.planner.storage_reservations",
    "torchrec.distributed.planner.enumerators",
    "torchrec.distributed.planner.shard_estimators",
    "torchrec.distributed.planner.proposers",
    "torchrec.distributed.planner.partitioners",
    "torchrec.distributed.planner.stats",
    "torchrec.distributed.sharding_plan",
    "torchrec.distributed.comm",
    "torchrec.distributed.shard",
    "torchrec.distributed.fbgemm_qcomm_codec",
    "torchrec.quant.embedding_modules",
    "torchrec.inference.modules",
]

# FBGEMM modules are mostly kernels; TorchRec programs import only these few names from them.
FBGEMM = {
    "fbgemm_gpu.split_embedding_configs": ["EmbOptimType", "SparseType"],
    "fbgemm_gpu.split_table_batched_embeddings_ops_common": [
        "BoundsCheckMode",
        "CacheAlgorithm",
        "EmbeddingLocation",
        "PoolingMode",
    ],
    "fbgemm_gpu.split_table_batched_embeddings_ops_training": [
        "ComputeDevice",
        "DenseTableBatchedEmbeddingBagsCodegen",
        "SplitTableBatchedEmbeddingBagsCodegen",
    ],
    "fbgemm_gpu.split_table_batched_embeddings_ops": [
        "BoundsCheckMode",
        "CacheAlgorithm",
        "ComputeDevice",
        "EmbeddingLocation",
        "OptimType",
        "PoolingMode",
        "SparseType",
        "SplitTableBatchedEmbeddingBagsCodegen",
    ],
}

# Module (and everything under it) -> why users do not import it.
LEFT_OUT = {
    "torchrec.version": "no names (the version string is shardkit.__version__)",
    "torchrec.types": "internal mixins for copying modules in TorchRec's inference",
    "torchrec.utils": "internal logging helpers",
    "torchrec.fx": "TorchRec's torch.fx tracer for TorchScript inference; shardkit modules trace "
    "with torch.fx as they are",
    "torchrec.pt2": "internal checks for torch.compile inside TorchRec",
    "torchrec.schema": "internal API-stability test helpers",
    "torchrec.sparse.jagged_tensor_validator": "internal; KeyedJaggedTensor.validate() checks",
    "torchrec.sparse.tensor_dict": "internal TensorDict conversion",
    "torchrec.datasets.scripts": "command-line preprocessing of the Criteo files; shardkit train "
    "reads raw Criteo files itself (docs/data.md)",
    "torchrec.datasets.test_utils": "TorchRec's own test helpers",
    "torchrec.models.cuda_graph_utils": "CUDA-graph benchmarking helpers",
    "torchrec.models.cuda_graph_benchmark": "CUDA-graph benchmark script",
    "torchrec.models.experimental": "experimental models",
    "torchrec.modules.debug_embedding_modules": "debugging variants of the collections",
    "torchrec.modules.embedding_tower": "embedding towers exist for TorchRec's tower sharding, "
    "which shardkit does not have; compose the collection and the interaction in a module",
    "torchrec.modules.feature_processor": "superseded by torchrec.modules.feature_processor_",
    "torchrec.modules.fused_embedding_modules": "deprecated in TorchRec; use "
    "apply_optimizer_in_backward or fused_params",
    "torchrec.modules.hash_mc_evictions": "hash-based managed collision (ZCH) internals",
    "torchrec.modules.hash_mc_metrics": "hash-based managed collision (ZCH) internals",
    "torchrec.modules.hash_mc_modules": "hash-based managed collision (ZCH), FBGEMM kernels",
    "torchrec.modules.itep_embedding_modules": "ITEP pruning, FBGEMM kernels",
    "torchrec.modules.itep_modules": "ITEP pruning, FBGEMM kernels",
    "torchrec.modules.keyed_jagged_tensor_pool": "object pools for TorchRec's feature store",
    "torchrec.modules.object_pool": "object pools for TorchRec's feature store",
    "torchrec.modules.object_pool_lookups": "object pools for TorchRec's feature store",
    "torchrec.modules.tensor_pool": "object pools for TorchRec's feature store",
    "torchrec.modules.lazy_extension": "TorchRec's extension of torch's LazyModuleMixin; use "
    "torch.nn.LazyModuleMixin",
    "torchrec.modules.mc_adapter": "adapter for TorchRec's hash-based managed collision",
    "torchrec.modules.pec_embedding_modules": "PEC collision handling, FBGEMM kernels",
    "torchrec.modules.pruning_logger": "internal logging",
    "torchrec.modules.regroup": "performance modules behind KeyedTensor.regroup_as_dict; call it",
    "torchrec.optim.semi_sync": "cross-region semi-synchronous training (DiLoCo), not in shardkit",
    "torchrec.metrics": "(the modules not listed above) metrics beyond the six shardkit has (AUC, NE, calibration, CTR, "
    "accuracy, MSE) and TorchRec's CPU-offloaded metric modules; RecMetricModule refuses their "
    "RecMetricEnum by name",
    "torchrec.distributed": "(the modules not listed above) TorchRec's sharding internals (kernels, lookups, input/output "
    "dists, sharding strategies, benchmarks); shardkit's own live in shardkit.sharding",
    "torchrec.quant": "(the modules not listed above) torchrec.quant.utils: internal",
    "torchrec.inference": "(the modules not listed above) TorchRec's gRPC/TorchScript serving "
    "stack (client, packagers, predict factories)",
}

_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]+")
_PLAIN = (str, int, float, bool, list, tuple, dict, frozenset, set)


def public_names(module_name: str) -> list[str]:
    """The public names of one module, by the rule in this file's docstring."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    is_package = hasattr(module, "__path__")
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        home = getattr(value, "__module__", "") or ""
        if home == module_name or (is_package and home.startswith("torchrec")):
            names.add(name)
    if not is_package:
        names |= _constants(module)
    return sorted(names)


def _constants(module) -> set[str]:
    found = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            if not (isinstance(target, ast.Name) and _CONSTANT.fullmatch(target.id)):
                continue
            if isinstance(getattr(module, target.id, None), _PLAIN):
                found.add(target.id)
    return found


def unchosen_modules() -> list[str]:
    """TorchRec modules neither listed nor left out (must be empty)."""
    import torchrec

    found = [m.name for m in pkgutil.walk_packages(torchrec.__path__, "torchrec.", onerror=print)]
    missing = []
    for name in found:
        if ".test" in name or name in MODULES:
            continue
        if any(name == left or name.startswith(left + ".") for left in LEFT_OUT):
            continue
        if any(m.startswith(name + ".") for m in MODULES):
            continue  # a package on the way to a listed module
        missing.append(name)
    return missing


def read_marks(path: Path) -> dict[tuple[str, str], str]:
    """``{(module, name): "refused: ..." | "pending: ..."}`` from an existing list."""
    marks: dict[tuple[str, str], str] = {}
    module = None
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("[") and line.endswith("]"):
            module = line[1:-1]
        elif line and not line.startswith("#") and module and "|" in line:
            name, mark = (part.strip() for part in line.split("|", 1))
            marks[(module, name)] = mark
    return marks


HEADER = """\
# The public names of TorchRec 1.8's user-facing modules (and the FBGEMM names TorchRec programs
# import), and what shardkit does with each. tests/compat/test_torchrec_names.py checks every line.
# Regenerate (keeps the marks): ~/.cache/shardkit-peers/venv/bin/python tests/compat/list_torchrec_names.py
#
# [torchrec.X.Y] is shardkit.X.Y; [fbgemm_gpu.X] is shardkit.fbgemm_gpu.X.
#   Name                   shardkit has it at that path, and it works
#   Name | refused: ...    left out on purpose: importing it raises NotInShardkitError with this text
#   Name | pending: ...    not there yet; the named work will provide it
"""


def render(names: dict[str, list[str]], marks: dict[tuple[str, str], str]) -> str:
    lines = [HEADER]
    for module, module_names in names.items():
        lines.append(f"[{module}]")
        for name in module_names:
            mark = marks.get((module, name))
            lines.append(f"{name} | {mark}" if mark else name)
        lines.append("")
    lines.append("# Modules left out, and why:")
    for module, reason in sorted(LEFT_OUT.items()):
        lines.append(f"#   {module}: {reason}")
    return "\n".join(lines) + "\n"


def main() -> int:
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    unchosen = unchosen_modules()
    if unchosen:
        print("list these modules in MODULES or give LEFT_OUT a reason:", *unchosen, sep="\n  ")
        return 1
    names = {module: public_names(module) for module in MODULES}
    for module, wanted in FBGEMM.items():
        present = set(public_names(module)) | set(dir(importlib.import_module(module)))
        absent = sorted(set(wanted) - present)
        if absent:
            print(f"{module} has no {absent}")
            return 1
        names[module] = sorted(wanted)
    LIST.write_text(render(names, read_marks(LIST)))
    total = sum(len(v) for v in names.values())
    print(f"wrote {total} names of {len(names)} modules to {LIST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
