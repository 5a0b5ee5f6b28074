"""TorchRec's other pipelines on top of `TrainPipelineBase` and `TrainPipelineSparseDist`: the
eval pipeline (forward only, batches loaded by a thread), the variants whose differences are
CUDA-stream scheduling (same results: they run as `TrainPipelineSparseDist`), the compiled
pipeline, a staged pipeline of user stages, and gradient accumulation.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardkit.sharding._pipeline._feeds import prefetch_into, sharded_collections
from shardkit.sharding._pipeline._prefetches import Prefetches
from shardkit.sharding._pipeline._train import (
    TorchCompileConfig,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
)

__all__ = [
    "DataLoadingThread",
    "EvalPipelineSparseDist",
    "GradientAccumulationConfig",
    "GradientAccumulationWrapper",
    "PrefetchTrainPipelineSparseDist",
    "SparseDataDistUtil",
    "StagedTrainPipeline",
    "TrainPipelineFusedSparseDist",
    "TrainPipelinePT2",
    "TrainPipelineSparseDistCompAutograd",
]

logger = logging.getLogger(__name__)

_END = object()


class DataLoadingThread(threading.Thread):
    """Loads batches from ``dataloader_iter`` (moved to ``device``) one ahead, in a thread;
    `get_next_batch` returns the next one, or None after the last."""

    def __init__(
        self,
        device: torch.device,
        dataloader_iter: Iterator[Any],
        to_device_non_blocking: bool,
        memcpy_stream_priority: int = 0,
        memcpy_stream: Any = None,
    ) -> None:
        super().__init__(name="shardkit-data-loading", daemon=True)
        self._device = torch.device(device)
        self._iter = dataloader_iter
        self._non_blocking = to_device_non_blocking
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                batch = next(self._iter)
                if hasattr(batch, "to"):
                    batch = batch.to(self._device, non_blocking=self._non_blocking)
                item: Any = batch
            except StopIteration:
                item = _END
            except BaseException as error:  # handed to the consumer, raised there
                item = error
            self._put(item)
            if item is _END or isinstance(item, BaseException):
                return

    def _put(self, item: Any) -> None:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def stop(self) -> None:
        self._stopped.set()

    def get_next_batch(self, none_throws: bool = False) -> Any:
        """The next batch; None after the last (StopIteration if ``none_throws``)."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item is _END:
            self._queue.put(_END)  # every later call sees the end too
            if none_throws:
                raise StopIteration
            return None
        return item


class EvalPipelineSparseDist(TrainPipelineSparseDist):
    """Forward only, with the next batch's input dist overlapped and batches loaded by a
    `DataLoadingThread` (TorchRec's eval pipeline). Put the model in eval mode yourself
    (``model.eval()``) as in TorchRec; the optimizer is never stepped."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None = None,
        apply_jit: bool = False,
        pipeline_postproc: bool = False,
        enable_inplace_copy_batch: bool = False,
        free_features_storage_early: bool = False,
        clear_data_dist_inputs: bool = False,
    ) -> None:
        super().__init__(model, optimizer, device, apply_jit=apply_jit)
        self._loader: DataLoadingThread | None = None

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        if self._loader is None:
            device = self._device or torch.device("cpu")
            self._loader = DataLoadingThread(device, dataloader_iter, True)
            self._loader.start()
        loader = self._loader
        return super().progress(_LoaderIterator(loader))

    def _step(self, batch: Any, between: Callable[[], None]) -> Any:
        _, output = self._model_fwd(batch)
        between()
        if self._agree_at_fetch():
            self._check_prefetches_used()  # See [Note: prefetches no forward uses]
        else:
            self._check_lead_used()  # See [Note: deferred agreement]
        return output

    def reset(self) -> None:
        super().reset()
        if self._loader is not None:
            self._loader.stop()
        self._loader = None

    def __del__(self) -> None:
        loader = getattr(self, "_loader", None)
        if loader is not None:
            loader.stop()


class _LoaderIterator:
    def __init__(self, loader: DataLoadingThread) -> None:
        self._loader = loader

    def __iter__(self) -> _LoaderIterator:
        return self

    def __next__(self) -> Any:
        return self._loader.get_next_batch(none_throws=True)


class PrefetchTrainPipelineSparseDist(TrainPipelineSparseDist):
    """TorchRec's pipeline that also prefetches rows into a UVM cache; shardkit has no cache,
    so this is `TrainPipelineSparseDist` (same results)."""

    def __init__(self, model, optimizer, device=None, execute_all_batches=True,
                 apply_jit=False, pipeline_postproc=True, custom_model_fwd=None,
                 enable_inplace_copy_batch=False, free_features_storage_early=False,
                 clear_data_dist_inputs=False) -> None:  # fmt: skip
        super().__init__(model, optimizer, device, execute_all_batches, apply_jit,
                         custom_model_fwd=custom_model_fwd)  # fmt: skip


class TrainPipelineFusedSparseDist(TrainPipelineSparseDist):
    """TorchRec's pipeline that runs the embedding lookup on a separate CUDA stream; the same
    steps in one stream here (same results)."""

    def __init__(self, model, optimizer, device=None, execute_all_batches=True,
                 apply_jit=False, pipeline_postproc=True, custom_model_fwd=None, strict=False,
                 emb_lookup_stream="data_dist", embedding_lookup_after_data_dist=False,
                 enable_inplace_copy_batch=False, enqueue_batch_after_forward=False,
                 free_features_storage_early=False, clear_data_dist_inputs=False) -> None:  # fmt: skip
        super().__init__(model, optimizer, device, execute_all_batches, apply_jit,
                         custom_model_fwd=custom_model_fwd)  # fmt: skip


class TrainPipelineSparseDistCompAutograd(TrainPipelineSparseDist):
    """TorchRec's pipeline under torch's compiled autograd; here backward runs in plain
    autograd (same results)."""


class TrainPipelinePT2(TrainPipelineBase):
    """`TrainPipelineBase` that compiles the model with ``torch.compile`` before batch
    ``compile_configs.compile_on_iter`` (``pre_compile_fn``/``post_compile_fn`` run around it;
    ``input_transformer`` maps each batch first)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None = None,
        compile_configs: TorchCompileConfig | None = None,
        pre_compile_fn: Callable[[nn.Module], None] | None = None,
        post_compile_fn: Callable[[nn.Module], None] | None = None,
        input_transformer: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(model, optimizer, device)
        self._compile = compile_configs or TorchCompileConfig()
        self._pre, self._post = pre_compile_fn, post_compile_fn
        self._transform = input_transformer or (lambda batch: batch)
        self._iteration = 0

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        if self._iteration == self._compile.compile_on_iter:
            if self._pre is not None:
                self._pre(self._model)
            self._model_fwd = torch.compile(
                self._model, fullgraph=self._compile.fullgraph, dynamic=self._compile.dynamic,
                backend=self._compile.backend,
            )  # fmt: skip
            if self._post is not None:
                self._post(self._model)
        self._iteration += 1
        return super().progress(map(self._transform, dataloader_iter))


class SparseDataDistUtil:
    """Stages for `StagedTrainPipeline`: ``start_sparse_data_dist(batch)`` starts the input
    dist of the batch's KJTs on the model's sharded collections and returns the batch;
    ``wait_sparse_data_dist(batch)`` is a stage that waits (the collections wait in their
    forward)."""

    def __init__(self, model: nn.Module, data_dist_stream: Any = None, apply_jit: bool = False,
                 prefetch_stream: Any = None, pipeline_postproc: bool = False,
                 embedding_lookup_stream: Any = None) -> None:  # fmt: skip
        if apply_jit:
            raise ValueError("SparseDataDistUtil(apply_jit=True): not in shardkit; leave False")
        self.model = model
        self._collections = sharded_collections(model, lead=None)
        self._prefetches = Prefetches(self._collections)  # See [Note: pipelined forward]

    def start_sparse_data_dist(self, batch: Any, *args: Any) -> Any:
        self._prefetches.attach()
        prefetch_into(self._prefetches, self._collections, batch)
        return batch

    def wait_sparse_data_dist(self, batch: Any = None, *args: Any) -> Any:
        return batch


class StagedTrainPipeline(TrainPipeline):
    """Runs each batch through ``pipeline_stages`` in order (each stage has ``name`` and
    ``runnable``: batch -> next stage's input) and returns the last stage's output, None once
    the data is done. The stages run one after the other for each batch (no CUDA streams)."""

    def __init__(self, pipeline_stages: Sequence[Any], debug_mode: bool = False,
                 compute_stream: Any = None, on_flush_end: Callable[[], None] | None = None) -> None:  # fmt: skip
        super().__init__()
        if not pipeline_stages:
            raise ValueError("StagedTrainPipeline needs at least one stage")
        self._stages = list(pipeline_stages)
        self._on_flush_end = on_flush_end
        self._done = False

    @property
    def num_stages(self) -> int:
        return len(self._stages)

    def set_flush(self, flush: bool) -> None:
        """Nothing is ever in flight between calls: a flush has nothing to do."""

    def flush_end(self) -> None:
        if self._on_flush_end is not None:
            self._on_flush_end()

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        if self._done:
            return None
        try:
            value = next(dataloader_iter)
        except StopIteration:
            self._done = True
            for stage in self._stages:
                callback = getattr(stage, "data_exhausted_callback", None)
                if callback is not None:
                    callback()
            return None
        for stage in self._stages:
            value = stage.runnable(value)
        return value


@dataclass
class GradientAccumulationConfig:
    """Step the optimizer every ``num_steps`` micro-batches (after ``num_warmup_steps`` that
    always sync); ``num_steps > 1`` enables it."""

    is_enabled: bool = False
    num_steps: int = 1
    num_warmup_steps: int = 1

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.num_warmup_steps < 1:
            raise ValueError(f"num_warmup_steps must be >= 1, got {self.num_warmup_steps}")
        if self.num_steps > 1:
            self.is_enabled = True


class _AccumulatingOptimizer:
    """Zeroes gradients after a real step only, and steps every ``num_steps``-th call."""

    def __init__(self, optimizer: torch.optim.Optimizer, config: GradientAccumulationConfig):
        self._optimizer = optimizer
        self._config = config
        self.current_step = 0
        self._needs_zero_grad = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._needs_zero_grad:
            self._optimizer.zero_grad(set_to_none=set_to_none)
            self._needs_zero_grad = False

    def step(self, *args: Any, **kwargs: Any) -> None:
        if (self.current_step + 1) % self._config.num_steps == 0:
            self._optimizer.step(*args, **kwargs)
            self._needs_zero_grad = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


class GradientAccumulationWrapper:
    """Gradient accumulation around a pipeline: its optimizer steps every ``num_steps``
    batches, on the gradients summed over them. Tables with fused optimizers still update in
    every backward (as in TorchRec)."""

    def __init__(self, pipeline: TrainPipeline, optimizer: torch.optim.Optimizer,
                 model: nn.Module, config: GradientAccumulationConfig) -> None:  # fmt: skip
        self._pipeline = pipeline
        self._config = config
        self.optimizer_wrapper = _AccumulatingOptimizer(optimizer, config)
        if config.is_enabled and hasattr(pipeline, "_optimizer"):
            pipeline._optimizer = self.optimizer_wrapper

    @property
    def current_step(self) -> int:
        return self.optimizer_wrapper.current_step

    def set_step(self, step: int) -> None:
        self.optimizer_wrapper.current_step = step

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        output = self._pipeline.progress(dataloader_iter)
        self.optimizer_wrapper.current_step += 1
        return output

    def reset(self) -> None:
        self._pipeline.reset()
        self.optimizer_wrapper.current_step = 0
        self.optimizer_wrapper._needs_zero_grad = True
