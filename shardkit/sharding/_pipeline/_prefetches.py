"""The input dists a pipeline started ahead of their forwards: one queue per sharded collection,
owned by the pipeline, and the pipelined forward that uses them.

[Note: pipelined forward]
A sharded collection has ``input_dist`` and ``compute_and_output_dist``; its own ``forward``
runs one after the other. A pipeline starts a collection's input dist ahead of its forward
(one step ahead, or, synchronously, just before it, carrying the ranks' agreement) and keeps
what it started in the collection's `PrefetchQueue`. While the pipeline is attached, the
collection's ``forward`` is its queue's `PrefetchQueue.forward` (set on the instance, as
TorchRec swaps in its ``PipelinedForward``): given the very KJT object an input dist was
started for, it computes on that input (older ones, which no forward used, are dropped); any
other KJT runs the collection's own input dist first, as the collection's forward does.
`Prefetches.detach` puts the collections' own forwards back, keeping the queues and the inputs
in flight; `Prefetches.attach` installs the queues' forwards again. A pipeline attaches at each
step, so two pipelines over one model (a train and an eval pipeline) each find their own
queues when they run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shardkit.sharding._collection._base import DistributedInput, ShardedCollection
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["PrefetchQueue", "Prefetches"]

# Input dists started ahead of their forward that a queue keeps (the pipeline needs 2).
_MAX_STARTED = 2


class PrefetchQueue:
    """The input dists started for one collection that no forward has used yet."""

    def __init__(self, module: ShardedCollection) -> None:
        self.module = module
        self._started: list[DistributedInput] = []
        self._consumed = 0  # started inputs a forward used

    def prefetch(self, features: KeyedJaggedTensor, *, tag: int = 0) -> None:
        """Start the input dist of ``features`` now; the forward that receives this very KJT
        object uses it. ``tag``: see `ShardedCollection.input_dist`."""
        self._started.append(self.module.input_dist(features, tag=tag))
        del self._started[:-_MAX_STARTED]

    def forward(self, features: KeyedJaggedTensor) -> Any:
        """The collection's forward while the pipeline is attached ([Note: pipelined forward])."""
        module = self.module
        for index, started in enumerate(self._started):
            if started.features is features:
                del self._started[: index + 1]  # older ones were never used
                self._consumed += 1
                return module.compute_and_output_dist(started)
        return module.compute_and_output_dist(module.input_dist(features))

    def unused_prefetches(self) -> int:
        """Started inputs no forward has used yet."""
        return len(self._started)

    def consumed_prefetches(self) -> int:
        """Started inputs a forward has used (a pipeline compares against its own snapshot, see
        [Note: prefetches no forward uses])."""
        return self._consumed

    def drop_prefetches(self) -> int:
        """Wait for the started inputs no forward has used and discard them (their collectives
        completed, on every rank alike); returns how many."""
        dropped, self._started = self._started, []
        for started in dropped:
            started.pending.wait()
        return len(dropped)

    def installed(self) -> bool:
        """Whether the collection's forward is this queue's."""
        return getattr(self.module.__dict__.get("forward"), "__self__", None) is self


class Prefetches:
    """A pipeline's queues, one per sharded collection it prefetches for."""

    def __init__(self, collections: Iterable[ShardedCollection]) -> None:
        self._queues = {id(m): PrefetchQueue(m) for m in collections}
        self._replaced: dict[int, Any] = {}  # an instance forward of the user's we replaced

    def of(self, module: ShardedCollection) -> PrefetchQueue:
        """``module``'s queue (one of the collections the pipeline was built with)."""
        return self._queues[id(module)]

    def attach(self) -> None:
        """Make each collection's forward its queue's ([Note: pipelined forward])."""
        for key, queue in self._queues.items():
            if queue.installed():
                continue
            current = queue.module.__dict__.get("forward")
            if current is not None and not isinstance(getattr(current, "__self__", None), PrefetchQueue):  # fmt: skip
                self._replaced[key] = current
            queue.module.forward = queue.forward  # type: ignore[method-assign]

    def detach(self) -> None:
        """Give each collection its own forward back; the queues keep what they started."""
        for key, queue in self._queues.items():
            if not queue.installed():
                continue  # another pipeline's, or none
            del queue.module.forward
            if key in self._replaced:
                queue.module.forward = self._replaced.pop(key)  # type: ignore[method-assign]
