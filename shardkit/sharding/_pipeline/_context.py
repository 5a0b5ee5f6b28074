"""What TorchRec's train pipelines take and keep besides the model: the per-batch context and
`TrainPipelinePT2`'s compile settings (shardkit's pipelines are in `_train`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TorchCompileConfig", "TrainPipelineContext"]


@dataclass
class TrainPipelineContext:
    """What TorchRec's pipelines keep per batch (shardkit keeps its prefetched inputs in the
    collections; ``index`` counts the batches, ``version`` is TorchRec's context version)."""

    input_dist_splits_requests: dict[str, Any] = field(default_factory=dict)
    input_dist_tensors_requests: dict[str, Any] = field(default_factory=dict)
    module_contexts: dict[str, Any] = field(default_factory=dict)
    module_contexts_next_batch: dict[str, Any] = field(default_factory=dict)
    fused_splits_awaitables: list[Any] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    postproc_fwd_results: dict[str, Any] = field(default_factory=dict)
    index: int | None = None
    version: int = 0


@dataclass
class TorchCompileConfig:
    """How `TrainPipelinePT2` compiles the model: ``torch.compile(model, fullgraph=...,
    dynamic=..., backend=...)`` before batch ``compile_on_iter``."""

    fullgraph: bool = False
    dynamic: bool | None = None
    backend: str = "inductor"
    compile_on_iter: int = 3
