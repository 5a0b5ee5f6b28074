"""Let gloo's worker threads let go of the last collectives' tensors before Python shuts down.

[Note: gloo at exit]
A gloo worker thread holds each collective's work (and through it the tensors sent and
received) until it has finished and moved on, which can be later than the moment ``wait()``
returned on the main thread: on a busy machine the worker may not run again for a while. Since
torch 2.10 a C++ holder of a tensor beyond the first one holds a reference to the tensor's
Python object too, so the worker's release takes the GIL for every tensor Python has seen (a
program's own tensors always), whether Python still holds it or not. A worker that asks for the
GIL while the main thread is in its last moments before finalizing (the end of the exit
handlers, then C code that keeps the GIL) is still waiting when the interpreter starts to
finalize; Python then ends the thread inside the work's C++ destructor, and the process aborts
with "terminate called without an active exception" (SIGABRT) after the program has finished,
with no Python traceback. One rank of a 2-rank run did so about once in 25-50 runs here; a core
dump showed the worker in ``~AsyncAllgatherWork`` waiting for the GIL and the main thread in
the interpreter's final garbage collection.

So every collective on CPU tensors (gloo's) remembers, weakly, each tensor it hands to the
backend with the tensor's use count just before (its other holders: the Python object, a view's
base, a hook); at exit, while the interpreter is still whole, we wait until each one's count is
back to that, bounded by `EXIT_WAIT_S`: the worker then has taken and released the GIL while the
main thread slept. shardkit's collectives remember by themselves; a program's own calls of
``torch.distributed``'s collectives (a loss's all-reduce, a metric's all-gather at the end) do
once `watch_torch_collectives` wrapped them, which ``shardkit run`` does before the program
starts. Weak references cost no memory; the wait is usually nothing.
"""

from __future__ import annotations

import atexit
import collections
import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = [
    "EXIT_WAIT_S",
    "drain",
    "remember",
    "unwatch_torch_collectives",
    "watch_torch_collectives",
]

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 2.0
# Weak references to the tensors of the latest collectives: a gloo worker that has not run
# since holds at most one work, and the other worker(s) take the later ones in the meantime.
_RECENT: collections.deque[tuple[weakref.ref[torch.Tensor], int]] = collections.deque(maxlen=4096)
_registered = False

# torch.distributed's functions that hand tensors to a backend. The object collectives
# (all_gather_object, ...) call these from their own module, which is wrapped too.
_TORCH_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "all_gather_coalesced", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
)  # fmt: skip
# (module, name) -> the function our wrapper replaced there.
_WATCHED: dict[tuple[Any, str], Callable[..., Any]] = {}


def remember(*tensors: torch.Tensor) -> None:
    """Note the tensors a collective is about to hand to its backend (CPU ones only)."""
    global _registered
    cpu = [t for t in tensors if t.device.type == "cpu"]
    if not cpu:
        return
    if not _registered:
        atexit.register(drain)
        _registered = True
    for tensor in cpu:
        _RECENT.append((weakref.ref(tensor), tensor._use_count()))  # type: ignore[attr-defined]  # no stub


def drain(wait_s: float = EXIT_WAIT_S) -> bool:
    """Wait (at most ``wait_s``) until no backend thread holds a remembered tensor; forget them.

    Returns:
        True if none was held when it returned, False if it gave up after ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    released = True
    while _RECENT:
        ref, before = _RECENT.pop()
        tensor = ref()
        while tensor is not None and tensor._use_count() > before:  # type: ignore[attr-defined]
            if time.monotonic() >= deadline:
                released = False
                break
            time.sleep(0.001)
        del tensor
    if not released:
        logger.debug("comm: a backend thread still held a tensor after %.1f s at exit", wait_s)
    return released


def watch_torch_collectives() -> None:
    """Make ``torch.distributed``'s own collectives remember their tensors, as shardkit's do, so
    that the exit waits for gloo's workers to let go of them too ([Note: gloo at exit]).

    Wraps the functions of the ``torch.distributed`` namespace and of the module that defines
    them (where the object collectives find theirs), in this process, until
    `unwatch_torch_collectives`; a second call changes nothing. A name imported from
    ``torch.distributed`` before the call keeps torch's function.
    """
    for module in (dist, c10d):
        for name in _TORCH_COLLECTIVES:
            fn = getattr(module, name, None)
            if fn is None or (module, name) in _WATCHED:
                continue
            _WATCHED[(module, name)] = fn
            setattr(module, name, _watched(fn))


def unwatch_torch_collectives() -> None:
    """Give ``torch.distributed`` its own functions back (where ours are still in place)."""
    for (module, name), fn in list(_WATCHED.items()):
        if getattr(getattr(module, name, None), "__wrapped__", None) is fn:
            setattr(module, name, fn)
        del _WATCHED[(module, name)]


def _watched(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def remembering(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():  # (traced, it is torch's own call, unbroken)
            remember(*_tensors_in(args), *_tensors_in(kwargs.values()))
        return fn(*args, **kwargs)

    return remembering


def _tensors_in(values: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors among ``values``: themselves, in lists (of lists) of them, or a P2POp's."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)) and depth < 2:
            yield from _tensors_in(value, depth + 1)
        elif isinstance(getattr(value, "tensor", None), torch.Tensor):
            yield value.tensor
