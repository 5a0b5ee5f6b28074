"""Let gloo's worker threads let go of the last collectives' tensors before Python shuts down.

[Note: gloo at exit]
A gloo worker thread holds each collective's work (and through it the tensors sent and
received) until it has finished and moved on, which can be later than the moment ``wait()``
returned on the main thread: on a busy machine the worker may not run again for a while. If
Python's last reference to such a tensor went away meanwhile, torch keeps the tensor's Python
object alive for the C++ side, and the worker's final release must take the GIL to free it. Should
that happen while the interpreter shuts down, the worker thread is ended inside a C++ destructor
and the process aborts with "terminate called without an active exception" (SIGABRT) after the
program has finished: one rank of a 2-rank run did so about once in 25 runs here. So every
collective on CPU tensors (gloo's) remembers, weakly, each tensor it hands to the backend with
the tensor's use count just before (its other holders: the Python object, a view's base, a
hook); at exit, while the interpreter is still whole, we wait until each one's count is back
to that, bounded by `EXIT_WAIT_S`. Weak references cost no memory; the wait is usually nothing.
"""

from __future__ import annotations

import atexit
import collections
import logging
import time
import weakref

import torch

__all__ = ["EXIT_WAIT_S", "drain", "remember"]

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 2.0
# Weak references to the tensors of the latest collectives: a gloo worker that has not run
# since holds at most one work, and the other worker(s) take the later ones in the meantime.
_RECENT: collections.deque[tuple[weakref.ref[torch.Tensor], int]] = collections.deque(maxlen=4096)
_registered = False


def remember(*tensors: torch.Tensor) -> None:
    """Note the tensors a collective is about to hand to its backend (CPU ones only)."""
    global _registered
    if not tensors or tensors[0].device.type != "cpu":
        return
    if not _registered:
        atexit.register(drain)
        _registered = True
    for tensor in tensors:
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
