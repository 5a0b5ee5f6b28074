"""TorchRec's train pipelines: `TrainPipelineBase` (one batch at a time) and
`TrainPipelineSparseDist` (batch i+1's ids travel while batch i computes).

[Note: pipelined input dist]
Each `TrainPipelineSparseDist.progress` call first fetches the next batch and starts its input
dist (the header all-to-all, then the ids all-to-alls left in flight) on every sharded
collection of the model a batch's KJT can feed, then runs forward, backward and the optimizer
step of the current batch, whose ids arrived during the previous step. Which KJT goes to which
collection is read off the batch: every KeyedJaggedTensor the batch holds
(``batch.sparse_features``, a dataclass field or attribute, a dict value) is prefetched for
every sharded collection whose features it has (a collection gets the first such only), except
a collection nested in another sharded module (a managed-collision or feature-processed
collection's own, which sees what that module made of the batch). A collection's forward uses a
prefetched input only for the very KJT object it was started for (the way DLRM-style models
pass ``batch.sparse_features`` on); a collection fed another KJT runs its input dist in its
forward: correct, not overlapped ([Note: prefetches no forward uses]; ranks whose batches feed
other collections all raise, [Note: prefetch mask], both in `_feeds`). What a pipeline started
is its own, not the collections': it swaps in their forwards while attached and `detach` gives
them back ([Note: pipelined forward] in `_prefetches`).

Every batch also has the ranks agree on whether each still has one: if some rank ran out
while others did not, all raise, naming the ranks, instead of some ranks waiting forever in a
collective the others never call ([Note: deferred agreement]: the flag rides the header of
the lead collection's input dist, which the pipeline starts first). So a synchronous pipeline,
too, starts the lead's input dist itself, just before that batch's forward (the other
collections start theirs in their forwards).

As in TorchRec, ``model(batch)`` returns ``(losses, output)``; in training mode (the model's
``training`` flag) the pipeline zeroes the gradients, runs ``losses.backward()`` (``torch.sum(
losses, dim=0).backward()`` for a loss per example) and steps the optimizer (the sharded tables' fused optimizers run inside
backward); in eval mode it only runs forward. `progress` returns ``output``.

When the next batch's input dist starts early, and on which streams, is in
`shardkit.sharding._pipeline._schedule` ([Note: when the pipeline overlaps],
[Note: pipeline streams]).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.compat import resolve_device
from shardkit.kernels import steady_heap
from shardkit.sharding._collection._base import ShardedCollection
from shardkit.sharding._dist._header import TagMismatchError
from shardkit.sharding._pipeline._agreement import (
    DataExhaustedError,
    Fetched,
    any_rank,
    start_agreement,
)
from shardkit.sharding._pipeline._context import TorchCompileConfig, TrainPipelineContext
from shardkit.sharding._pipeline._feeds import (
    batch_kjts,
    collection_names,
    drop_unused_on_any_rank,
    fed_collections,
    lead_collection,
    mismatch_error,
    prefetch_into,
    prefetch_mask,
    sharded_collections,
)
from shardkit.sharding._pipeline._prefetches import Prefetches
from shardkit.sharding._pipeline._schedule import (
    SideStreams,
    agreed_overlap,
    choose_overlap,
)

__all__ = [
    "DataExhaustedError",
    "TorchCompileConfig",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineContext",
    "TrainPipelineSparseDist",
    "batch_kjts",
    "choose_overlap",
]

logger = logging.getLogger(__name__)


class TrainPipeline(abc.ABC):
    """A training loop driven one step at a time: ``progress(dataloader_iter)`` trains on the
    next batch and returns the model's output; StopIteration when the data is done."""

    def __init__(self) -> None:
        logger.info("train pipeline: %s", type(self).__name__)

    @abc.abstractmethod
    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """One step; raises StopIteration when every batch is done."""

    def sync_embeddings(self, model: nn.Module, interval_batches: int | None, context=None):
        """Syncs replicas of 2D parallelism (``DMPCollection``, not in shardkit): nothing."""
        return None

    def reset(self) -> None:
        """Forget the data iterator: the next `progress` starts from a new one."""
        return None


def _to_device(batch: Any, device: torch.device | None) -> Any:
    if device is None or not hasattr(batch, "to"):
        return batch
    return batch.to(device, non_blocking=True)


class _Pipeline(TrainPipeline):
    """What both pipelines share: fetching (with the ranks agreeing), the step itself."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None,
        custom_model_fwd: Callable[[Any], tuple[torch.Tensor, Any]] | None,
        group: dist.ProcessGroup | None,
    ) -> None:
        super().__init__()
        self._model = model
        self._optimizer = optimizer
        device = resolve_device(device)  # See [Note: cuda on cpu] in shardkit.compat
        self._device = None if device is None else torch.device(device)
        self._streams = SideStreams.on(self._device)  # See [Note: pipeline streams]
        where = self._device if self._device is not None else getattr(model, "device", None)
        self._compute_device = torch.device(where if where is not None else "cpu")
        if self._compute_device.type == "cpu":
            steady_heap()  # See [Note: a steady heap] in shardkit.kernels
        self._model_fwd = custom_model_fwd or model
        self._group = group
        self._lead = lead_collection(model, group)  # None: flags ([Note: deferred agreement])
        self._collections = sharded_collections(model, lead=self._lead)  # the model's are fixed
        self._names = collection_names(model, self._collections)
        self._prefetches = Prefetches(self._collections)  # See [Note: pipelined forward]
        self._attached = True
        # what an overlapping fetch prefetches besides the lead (See [Note: prefetches no
        # forward uses]); what it started for the first batch, each queue's consumed_prefetches() then
        self._kept = self._collections[1:] if self._lead is not None else self._collections
        self._first: tuple[list[ShardedCollection], dict[int, int]] | None = None
        self._lead_fed = True
        self._lead_checked = False
        self._batch_count = 0
        self._next: Any = None
        self._connected = False

    def _fetch(self, dataloader_iter: Iterator[Any]) -> Fetched:
        """The next batch, its flags on their way (see [Note: deferred agreement] in `_agreement`)."""
        try:
            batch = next(dataloader_iter)
        except StopIteration:
            batch = None
        streams = self._streams
        with streams.copying() if streams else contextlib.nullcontext():
            if batch is not None:
                batch = _to_device(batch, self._device)
        with streams.distributing() if streams else contextlib.nullcontext():
            if self._lead is not None:
                carry = functools.partial(self._carry, self._lead)  # even after a fallback
                fetched = Fetched(batch, None, self._batch_count, carry=carry)
            else:
                tag = self._mask(batch) if batch is not None else 0
                flags = start_agreement(batch is not None, self._group, tag=tag)
                fetched = Fetched(batch, flags, self._batch_count)
            carried = fetched.carry is not None
            if self._agree_at_fetch():
                try:
                    batch = fetched.take()
                except TagMismatchError as error:  # See [Note: prefetch mask]
                    raise mismatch_error(error.tags, self._names) from None
            if batch is None:
                return fetched
            self._batch_count += 1
            self._started(batch, carried)
        return fetched

    def _carry(self, lead: ShardedCollection, batch: Any) -> None:
        """Start ``batch``'s input dist with this rank's flag and mask in the lead's header
        ([Note: deferred agreement]): `RanksExhaustedError` on every rank if only some have a
        batch, `TagMismatchError` if the masks differ (`_fetch` names the collections,
        [Note: prefetch mask]). A batch fetched before the fall back to flags joins with a
        header alone. It is every rank's first collective: nothing may start before it."""
        if self._streams is not None:
            self._streams.wait_for_copy()  # a synchronous take runs on the main stream
        if batch is None:
            lead.join_without_input(exhausted=True)
            return
        tag = self._mask(batch)
        fed = prefetch_into(self._prefetches, [lead], batch, tag=tag) if lead is self._lead else []
        if not fed:
            self._lead_fed = False
            lead.join_without_input(exhausted=False, tag=tag)
        self._prefetch_others(batch, fed)

    def _mask(self, batch: Any) -> int:
        """The collections an overlapping fetch starts for ``batch`` besides the lead, as the
        tag every rank must send alike ([Note: prefetch mask]); 0 where it starts none."""
        if not self._agree_at_fetch():
            return 0  # a synchronous forward starts their input dists itself
        return prefetch_mask(self._collections, fed_collections(self._kept, batch))

    def _prefetch_others(self, batch: Any, fed: list[ShardedCollection]) -> None:
        """Overlapping: start the other collections' input dists too, now that the ranks
        agreed; remember what the first batch got ([Note: prefetches no forward uses])."""
        if self._agree_at_fetch():
            fed = fed + prefetch_into(self._prefetches, self._kept, batch)
        if self._first is None:  # count the uses from this batch on, not since construction
            used = {id(m): self._prefetches.of(m).consumed_prefetches() for m in self._collections}
            self._first = fed, used

    def _check_prefetches_used(self) -> None:
        """After the first overlapped step: stop prefetching, on every rank at once, the
        collections whose forward used no prefetch on some rank; flags if the lead is one
        (see [Note: prefetches no forward uses]); one all-reduce, once."""
        if self._lead_checked:
            return
        self._lead_checked = True
        candidates = [m for m in (self._lead, *self._kept) if m is not None]
        fed, before = self._first or ([], {})
        unused = drop_unused_on_any_rank(
            self._prefetches, candidates, fed, self._group, consumed_before=before
        )
        if not unused:
            return
        logger.info(
            "train pipeline: the forwards of %s used no prefetched input (fed another KJT than "
            "the batch's); their input dists run in their forwards from now on%s",
            [self._names[self._collections.index(m)] for m in unused],
            "; the ranks agree on data by an all-gather per batch" if self._lead in unused else "",
        )
        self._kept = [m for m in self._kept if m not in unused]
        if self._lead in unused:
            self._lead = None

    def _check_lead_used(self) -> None:
        """After the first synchronous step: fall back to flags, on every rank at once, if on
        any rank the lead's forward did not use what was started for it (see
        [Note: deferred agreement]); one all-reduce, once."""
        if self._lead is None or self._lead_checked:
            return
        self._lead_checked = True
        unused = not self._lead_fed or self._prefetches.of(self._lead).unused_prefetches() > 0
        if not any_rank(unused, self._group):
            return
        logger.info(
            "train pipeline: the model's first sharded collection was not fed the batch's own "
            "KJT; the ranks agree on data by an all-gather per batch from now on"
        )
        self._prefetches.of(self._lead).drop_prefetches()
        self._lead = None

    def _agree_at_fetch(self) -> bool:
        """Whether the ranks must agree before `_fetch` returns (see [Note: deferred agreement])."""
        return False

    def _started(self, batch: Any, carried: bool) -> None:
        """What a pipeline starts for a fetched batch on the data-dist stream (nothing here);
        ``carried``: its input dist started with the agreement."""

    def _step(self, batch: Any, between: Callable[[], None]) -> Any:
        """Forward (and, in training mode, backward and optimizer step) of ``batch``;
        ``between`` runs after the forward."""
        if self._streams is not None:
            self._streams.hand_over(batch)
        training = self._model.training
        if training:
            self._optimizer.zero_grad()
        losses, output = self._model_fwd(batch)
        between()
        if training:
            # A scalar loss (the usual case) is its own sum: no extra op and autograd node
            (losses if losses.dim() == 0 else torch.sum(losses, dim=0)).backward()
            self._optimizer.step()
        if self._agree_at_fetch():
            self._check_prefetches_used()
        else:
            self._check_lead_used()
        return output

    def _resume(self) -> None:
        """Install the pipeline's forwards at each step ([Note: pipelined forward]): after a
        `detach`, as TorchRec attaches a detached model again, or where another pipeline over
        the model ran since."""
        self._attached = True
        self._prefetches.attach()

    def reset(self) -> None:
        self._connected = False
        self._next = None


class TrainPipelineBase(_Pipeline):
    """One batch at a time: fetch, move to ``device``, forward, backward, optimizer step.

    Args:
        model: returns ``(losses, output)`` for a batch (e.g. `DLRMTrain`).
        optimizer: steps the parameters that are not updated in backward.
        device: where batches go (``batch.to(device)``).
        custom_model_fwd: called instead of ``model(batch)``.
        enable_inplace_copy_batch: TorchRec's copy into preallocated memory (a speed knob; the
            batch is the same).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None = None,
        custom_model_fwd: Callable[[Any], tuple[torch.Tensor, Any]] | None = None,
        enable_inplace_copy_batch: bool = False,
        *,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(model, optimizer, device, custom_model_fwd, group)
        del enable_inplace_copy_batch  # same batch either way

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        self._resume()
        if not self._connected:
            self._next, self._connected = self._fetch(dataloader_iter), True
        batch = self._next.take() if self._next is not None else None
        if batch is None:
            raise StopIteration
        self._next = None

        def fetch_next() -> None:
            self._next = self._fetch(dataloader_iter)

        return self._step(batch, fetch_next)


class TrainPipelineSparseDist(_Pipeline):
    """Train ``model`` batch by batch with the next batch's input dist overlapped (see
    [Note: pipelined input dist]).

    Args:
        model: usually a `DistributedModelParallel`; ``model(batch)`` returns
            ``(losses, output)``.
        optimizer: the dense parameters' optimizer.
        device: where batches go (``batch.to(device)``; default: where they are).
        execute_all_batches: TorchRec's switch to run the last batches after the data ends;
            shardkit always runs every batch.
        apply_jit: TorchScript the unsharded modules; not in shardkit (False only).
        context_type: a `TrainPipelineContext` class for the per-batch contexts.
        custom_model_fwd: called instead of ``model(batch)``.
        pipeline_postproc, dmp_collection_sync_interval_batches, enqueue_batch_after_forward,
            enable_inplace_copy_batch, free_features_storage_early, clear_data_dist_inputs:
            TorchRec's scheduling and memory knobs; the results are the same.
        group: the process group the ranks agree through (default: the world).
        overlap: start each batch's input dist one step ahead (True) or in its own forward
            (False); default: overlap where it can help (see [Note: when the pipeline overlaps]).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None = None,
        execute_all_batches: bool = True,
        apply_jit: bool = False,
        context_type: type[TrainPipelineContext] = TrainPipelineContext,
        pipeline_postproc: bool = False,
        custom_model_fwd: Callable[[Any], tuple[torch.Tensor, Any]] | None = None,
        dmp_collection_sync_interval_batches: int | None = 1,
        enqueue_batch_after_forward: bool = False,
        enable_inplace_copy_batch: bool = False,
        free_features_storage_early: bool = False,
        clear_data_dist_inputs: bool = False,
        *,
        group: dist.ProcessGroup | None = None,
        overlap: bool | None = None,
    ) -> None:
        if apply_jit:
            raise ValueError(
                f"{type(self).__name__}(apply_jit=True): TorchScript compilation of the "
                "unsharded modules is not in shardkit; leave apply_jit False"
            )
        if not (isinstance(context_type, type) and issubclass(context_type, TrainPipelineContext)):
            raise TypeError(
                f"context_type must be a TrainPipelineContext class, got {context_type!r}"
            )
        super().__init__(model, optimizer, device, custom_model_fwd, group)
        self._context_type = context_type
        self.contexts: list[TrainPipelineContext] = []
        self._overlap = agreed_overlap(overlap, device=self._compute_device, group=self._group)

    def detach(self) -> nn.Module:
        """The model with its sharded collections' own forwards back (TorchRec's ``detach``):
        evaluate or checkpoint it outside the pipeline, then `attach` (or just call `progress`)
        to train on. The batches in flight stay with the pipeline, so training resumes where
        it stopped, as in TorchRec; see [Note: pipelined forward]."""
        self._prefetches.detach()
        self._attached = False
        return self._model

    def attach(self, model: nn.Module | None = None, sparse_dist: bool = True) -> None:
        """Install the pipeline's forwards again after `detach` (TorchRec's ``attach``; the
        next `progress` also does). ``model``: the one `detach` returned. ``sparse_dist``:
        TorchRec's switch to restart the current batch's input dist; shardkit keeps it in
        flight, so the results are the same either way."""
        if model is not None and model is not self._model:
            raise ValueError(
                f"{type(self).__name__}.attach(model): a {type(model).__name__} other than the "
                "model this pipeline was built with; the pipeline keeps that model's sharded "
                "collections and the batches in flight for them, so attach() or "
                "attach(pipeline.detach()'s model), or build a new pipeline for another model"
            )
        del sparse_dist  # same results either way
        self._resume()

    def _agree_at_fetch(self) -> bool:
        return self._overlap  # its input dist starts now (see [Note: deferred agreement])

    def _started(self, batch: Any, carried: bool) -> None:
        if self._overlap and not carried:
            self._prefetch_others(batch, [])  # See [Note: pipelined input dist]
        self.contexts.append(self._context_type(index=self._batch_count - 1, version=1))

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """One training step on the next batch; raises StopIteration when every rank is done.
        After that, as TorchRec's, the next call starts on the iterator it is given (a new
        epoch over a new iterator; the spent one raises StopIteration again)."""
        self._resume()
        if not self._connected:
            self._next, self._connected = self._fetch(dataloader_iter), True
        batch = self._next.take() if self._next is not None else None
        if batch is None:
            self.reset()
            raise StopIteration
        self._next = self._fetch(dataloader_iter)  # the next batch's ids start travelling
        output = self._step(batch, lambda: None)
        if self.contexts:
            self.contexts.pop(0)
        return output
