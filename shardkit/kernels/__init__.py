"""Compiled embedding kernels: C++ operators built on first use, and the choice of kernel.

[Note: compiled kernel]
The batched lookup (see [Note: batched kernel] in `shardkit.modules._kernel`) has two
implementations that compute the same thing:

- **eager**: pure torch ops (``F.embedding_bag``, a sort, and the rules of
  `shardkit.optim._rules`). It is the spec, and the fallback where nothing can be compiled.
- **compiled**: three ``torch.library`` operators in namespace ``shardkit`` (``pooled_forward``,
  ``fused_backward``, ``dense_backward``; ``bucket_rows`` serves the row-wise input dist, see
  [Note: compiled row bucketing] in ``csrc/buckets.cpp``, and ``shift_ids`` the ids' shift to
  rows of a stack, [Note: the ids' shift in one pass]), C++ in ``csrc/``, compiled
  for this CPU with ``torch.utils.cpp_extension`` the first time a process needs them (about
  20 s on 2 cores) and cached under ``~/.cache/shardkit/kernels/`` (``$SHARDKIT_CACHE_DIR``
  moves it), keyed by the sources, torch, Python and the CPU, so later processes load it in
  milliseconds.
  The sources, one concern each: ``forward.cpp``, ``grouping.cpp`` (the ids grouped by row),
  ``backward.cpp`` (the fused update), sharing ``common.h`` (element types, prefetch, checks)
  and free of torch headers; ``ops_cpu.cpp`` registers the operators (``ops_cuda.cu`` on GPUs);
  ``buckets.cpp`` is ``bucket_rows`` and ``shift_ids``, operators and registration in one (CPU
  only).

Backward, compiled: one counting sort of the batch's ids on the row itself where the table has
at most 2 rows per id, else one radix sort (32-bit keys, as few 11-bit passes as the number of
rows needs), groups their occurrences by row (see [Note: grouping by counting] in
``csrc/grouping.cpp``); then ONE pass over the unique rows in
ascending order sums each row's gradient from the output-gradient rows of its bags (per-sample
weights, which carry MEAN, applied on the way) and applies the optimizer rule to the row and its
state in place: on fp32 rows at a dim compiled in (16-256) the row's gradient stays in registers
and the rule runs from there, row by row (see [Note: a row's gradient in registers] in
``csrc/backward.cpp``); otherwise it goes through a small buffer of 16 rows (row-wise Adagrad
computes the 16 rows' scales together: [Note: row-wise Adagrad by blocks of rows]). No
``[unique rows, D]`` gradient is written;
the rows, their state and their gradient sources a few occurrences ahead are prefetched, so the
loop waits on memory as little as the hardware allows. Forward is one loop over bags that sums
rows in fp32, prefetching ahead, with per-sample weights fused, writing each bag's row where a
KeyedTensor wants it (example-major) so that no transpose follows. Plain fp32 SGD on one thread
skips the sort (see [Note: SGD without a sort] in ``csrc/backward.cpp``). fp16 and bf16 tables are
read and written in their dtype with fp32 math, rounding where the eager rule rounds. Tables of
4 MiB or more are asked onto 2 MiB pages when they are allocated (`advise_new_table`, before
their first write: [Note: huge pages from the first write] in ``_pages.py``) and again on first
use ([Note: huge pages for tables] in ``csrc/ops_cpu.cpp``): otherwise nearly every row costs a
TLB miss. One INFO line at load says
whether they are on; ``SHARDKIT_HUGE_PAGES=0`` or `set_huge_pages` turns them off, and
`huge_page_bytes` says how much of a tensor sits on them. A process training on the CPU keeps
its step's memory mapped between steps (`steady_heap`: [Note: a steady heap] in ``_heap.py``).

Which one runs is chosen once per process, at the first lookup: ``SHARDKIT_KERNEL`` =
``auto`` (the default: compiled if it builds and loads, else eager), ``compiled`` (an error if it
cannot be built) or ``eager``; `set_kernel` does the same from code and `use_kernel` for a block.
One INFO line from ``shardkit.kernels`` says which kernel runs and why (a build failure's reason
and the path of the compiler's output included). A lookup the compiled operators cannot serve
(e.g. a CUDA table without a CUDA build) runs eager, with one INFO line per reason.
"""

from shardkit.kernels._heap import steady_heap
from shardkit.kernels._ops import (
    bucket_rows,
    dense_backward,
    fused_backward,
    pooled_forward,
    shift_ids,
    unsupported,
)
from shardkit.kernels._pages import huge_page_bytes, set_huge_pages
from shardkit.kernels._select import (
    KernelPath,
    advise_new_table,
    kernel_path,
    set_kernel,
    use_kernel,
)

__all__ = [
    "KernelPath",
    "advise_new_table",
    "bucket_rows",
    "dense_backward",
    "fused_backward",
    "huge_page_bytes",
    "kernel_path",
    "pooled_forward",
    "set_huge_pages",
    "set_kernel",
    "shift_ids",
    "steady_heap",
    "unsupported",
    "use_kernel",
]
