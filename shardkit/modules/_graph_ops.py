"""The collections' lookups as operators `torch.compile` captures whole: no graph break.

[Note: collections under torch.compile]
A collection's forward reads its input's data on the host (``length_per_key`` to cut ``values``
per table group, the id checks, the plan's permutation), and its backward sorts the batch's ids
and updates the tables in place with the fused optimizer, whose step count and learning rate are
Python state. Traced op by op, each of those is a graph break (or a learning rate frozen into
the graph). So under `torch.compile` a collection is ONE custom operator, ``shardkit_graph::
pooled`` (`EmbeddingBagCollection`) or ``shardkit_graph::sequence`` (`EmbeddingCollection`),
whose implementation is the eager forward itself, and whose registered backward is another,
``..._backward``, that runs the eager backward (the same kernel, compiled or eager, and the same
fused update). The compiler sees static output shapes (the pooled ``[B, sum(dims)]``; a
sequence collection's rows ``[N, D]`` per group, in the input's order), so there is nothing
data-dependent to trace, and the compiled model computes exactly what the eager one does: the
same ids checks with the same messages, the same kernel calls, the same updates.

The backward operator declares that it writes the tables' buffers and the optimizer's state (the
compiler orders it and keeps it, and Inductor passes the tensors themselves, not copies); when a
compiler hands it copies anyway, it writes the update back into them, so the copy-back that
follows stays right. Learning rate and step are read when it runs, so a scheduler's change
applies at the next step, as in eager. The operators reach the module through a registry of live
collections (`register`), keyed by a number the graph holds as a constant.

Exported programs take the other road (aten operators only, see [Note: exported lookups]): they
must run where shardkit is not installed.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules._inputs import group_input, mean_as_weights
from shardkit.modules._kernel import lookup_backward, uses_compiled_kernel
from shardkit.modules._traced import ids_per_key_unbacked
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = ["graph_pooled", "graph_remap", "graph_sequence", "in_key_order", "register"]

_SEP = "\x1f"  # joins the keys into one string argument (a key never holds it)
_live: weakref.WeakValueDictionary[str, nn.Module] = weakref.WeakValueDictionary()


def register(module: nn.Module) -> str:
    """Make ``module`` reachable from the operators; returns its handle (a string: a graph
    holds it as a constant, where an int could become a symbol)."""
    handle = f"{type(module).__name__}@{id(module):x}"
    _live[handle] = module
    return handle


def _module(handle: str) -> Any:
    module = _live.get(handle)
    if module is None:
        raise RuntimeError(
            f"shardkit_graph: no live embedding collection has handle {handle!r}; the compiled "
            "graph outlived its module. Compile the module you run"
        )
    return module


def _kjt(keys: str, values: torch.Tensor, weights: torch.Tensor | None,
         lengths: torch.Tensor) -> KeyedJaggedTensor:  # fmt: skip
    return KeyedJaggedTensor(keys.split(_SEP), values, weights, lengths=lengths)


def _tables_of(module: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(the tables' Parameters, each group's buffer, every fused optimizer state tensor)."""
    groups = module._stack.groups
    params = [p for group in groups for p in group.params]
    buffers = [group.tables.weight for group in groups]
    states = [t for g in groups if g.tables.optimizer for t in g.tables.optimizer.state.values()]
    return params, buffers, states


def _param_grads(module: Any, grad_buffers: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Each Parameter's gradient: its rows of its group's dense gradient, None when fused."""
    grads: list[torch.Tensor | None] = []
    for group, grad in zip(module._stack.groups, grad_buffers):
        starts = group.tables.row_starts
        for k in range(len(group.params)):
            fused = group.tables.optimizer is not None
            grads.append(None if fused else grad[starts[k] : starts[k + 1]])
    return grads


def _write_back(module: Any, buffers: Sequence[torch.Tensor], states: Sequence[torch.Tensor]):
    """Where the compiler passed copies of the tables or state, give them the update too."""
    _, real_buffers, real_states = _tables_of(module)
    for given, real in zip([*buffers, *states], [*real_buffers, *real_states]):
        if given.data_ptr() != real.data_ptr():
            given.copy_(real)


def _dense_outputs(module: Any, buffers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Where a backward writes each group's dense gradient: the buffer's shape, or nothing
    for a group whose optimizer is fused (``[0]``)."""
    return [
        buffer.new_empty(0) if group.tables.optimizer is not None else torch.empty_like(buffer)
        for group, buffer in zip(module._stack.groups, buffers)
    ]


def _put_dense(out: torch.Tensor, param_grads: list[torch.Tensor | None]) -> None:
    """Write a dense group's per-table gradients (consecutive rows) into ``out``."""
    if out.numel():
        torch.cat([g for g in param_grads if g is not None], out=out)


# -- EmbeddingBagCollection --------------------------------------------------------------------


@torch.library.custom_op("shardkit_graph::pooled", mutates_args=())
def _pooled(
    values: torch.Tensor,
    lengths: torch.Tensor,
    weights: torch.Tensor | None,
    params: list[torch.Tensor],
    buffers: list[torch.Tensor],
    states: list[torch.Tensor],
    handle: str,
    keys: str,
) -> torch.Tensor:
    module = _module(handle)
    with torch.no_grad():
        return module._pooled(_kjt(keys, values, weights, lengths)).values()


@_pooled.register_fake
def _(values, lengths, weights, params, buffers, states, handle, keys):
    module = _module(handle)
    stride = lengths.shape[0] // len(keys.split(_SEP))
    dtype = buffers[0].dtype
    for buffer in buffers[1:]:
        dtype = torch.promote_types(dtype, buffer.dtype)
    return values.new_empty((stride, sum(module._dims)), dtype=dtype)


@torch.library.custom_op(
    "shardkit_graph::pooled_backward", mutates_args=("buffers", "states", "dense")
)
def _pooled_backward(
    grad: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    weights: torch.Tensor | None,
    buffers: list[torch.Tensor],
    states: list[torch.Tensor],
    dense: list[torch.Tensor],
    handle: str,
    keys: str,
    weights_grad: bool,
) -> torch.Tensor:
    module = _module(handle)
    with torch.no_grad():
        grad_weights = _pooled_backward_eager(module, _kjt(keys, values, weights, lengths), grad,
                                              weights_grad, dense)  # fmt: skip
        _write_back(module, buffers, states)
    return grad_weights


@_pooled_backward.register_fake
def _(grad, values, lengths, weights, buffers, states, dense, handle, keys, weights_grad):
    dtype = torch.float32 if weights is None else weights.dtype
    return values.new_empty(values.shape[0] if weights_grad else 0, dtype=dtype)


def _pooled_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    values, lengths, weights, params, buffers, states, handle, keys = inputs
    ctx.save_for_backward(values, lengths, weights)
    ctx.buffers, ctx.states, ctx.handle, ctx.keys = buffers, states, handle, keys
    ctx.num_params = len(params)


def _pooled_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    values, lengths, weights = ctx.saved_tensors
    wants = weights is not None and ctx.needs_input_grad[2]
    module = _module(ctx.handle)
    dense = _dense_outputs(module, ctx.buffers)
    grad_weights = torch.ops.shardkit_graph.pooled_backward(
        grad, values, lengths, weights, ctx.buffers, ctx.states, dense, ctx.handle, ctx.keys,
        wants,
    )  # fmt: skip
    params = _param_grads(module, dense)
    nothing = ([None] * len(ctx.buffers), [None] * len(ctx.states))
    return None, None, grad_weights if wants else None, params, *nothing, None, None


_pooled.register_autograd(_pooled_grad, setup_context=_pooled_setup)


def _pooled_backward_eager(
    module: Any,
    kjt: KeyedJaggedTensor,
    grad: torch.Tensor,
    weights_grad: bool,
    dense: Sequence[torch.Tensor],
) -> torch.Tensor:
    """The eager backward of `_pooled`: per group, its columns of ``grad`` ``[B, sum(dims)]``
    through `lookup_backward` (dense gradients into ``dense``); returns d loss / d the KJT's
    weights in the KJT's order."""
    num_ids = kjt.values().numel()
    kjt_in_plan, plan = module._prepare(kjt, validate=False)
    stride = kjt_in_plan.stride()
    columns = _columns(module, plan, grad.device)
    num_planned = kjt_in_plan.values().numel()
    grad_weights = grad.new_zeros(num_planned if weights_grad else 0, dtype=torch.float32)
    offsets = kjt_in_plan.offset_per_key()
    for group, spec, cols, out in zip(module._stack.groups, plan.groups, columns, dense):
        inputs = group_input(kjt_in_plan, spec)
        weights = inputs.per_sample_weights
        if not module._is_weighted and not any(spec.mean_per_key):
            weights = None
        wants = weights_grad and weights is not None
        param_grads, grad_psw = lookup_backward(
            group.tables, inputs.ids, inputs.offsets, weights,
            grad if cols is None else grad.index_select(1, cols),
            batch_size=stride, compiled=uses_compiled_kernel(group.tables, inputs.ids),
            grad_per_sample_weights=wants,
        )  # fmt: skip
        _put_dense(out, param_grads)
        if grad_psw is not None:  # per_sample_weights = weights x 1 / length for MEAN bags
            lo, hi = offsets[spec.first_key], offsets[spec.first_key + spec.num_keys]
            if any(spec.mean_per_key):
                mean = torch.tensor(spec.mean_per_key, device=grad.device).repeat_interleave(stride)
                scale = mean_as_weights(inputs.lengths, None, num_ids=hi - lo, mean=mean)
                grad_psw = grad_psw * scale
            grad_weights[lo:hi] = grad_psw.float()
    if weights_grad and plan.permute is not None:  # back to the input's order
        index = _permuted_positions(kjt, plan.permute)
        grad_weights = grad_weights.new_zeros(num_ids).index_add_(0, index, grad_weights)
    weights = kjt.weights_or_none()
    if weights is not None:
        grad_weights = grad_weights.to(weights.dtype)
    return grad_weights


def _columns(module: Any, plan: Any, device: torch.device) -> list[torch.Tensor | None]:
    """Per group, the columns of the pooled output ``[B, sum(dims)]`` that hold its keys, in
    the plan's order (the group's output is ``[B, K_g * D]``); None where that is all columns
    in order (one group whose keys are the module's). Cached per key order."""
    cache = module.__dict__.setdefault("_graph_columns", {})
    found = cache.get((plan.keys, device))
    if found is not None:
        return found
    starts: dict[str, int] = {}
    at = 0
    for name, dim in zip(module._feature_names, module._dims):
        starts[name] = at
        at += dim
    out: list[torch.Tensor | None] = []
    for group, spec in zip(module._stack.groups, plan.groups):
        dim = group.tables.dim
        keys = plan.keys[spec.first_key : spec.first_key + spec.num_keys]
        cols = [starts[key] + d for key in keys for d in range(dim)]
        identity = cols == list(range(at))
        out.append(None if identity else torch.tensor(cols, dtype=torch.int64, device=device))
    cache[(plan.keys, device)] = out
    return out


def _permuted_positions(kjt: KeyedJaggedTensor, order: Sequence[int]) -> torch.Tensor:
    """``[N']`` where each value of ``kjt.permute(order)`` sits in ``kjt``."""
    offsets, sizes = kjt.offset_per_key(), kjt.length_per_key()
    pieces = [torch.arange(offsets[i], offsets[i] + sizes[i]) for i in order]
    return torch.cat(pieces).to(kjt.device()) if pieces else torch.zeros(0, dtype=torch.int64)


def graph_pooled(module: Any, features: KeyedJaggedTensor) -> KeyedTensor:
    """An `EmbeddingBagCollection`'s forward as one `shardkit_graph::pooled` call."""
    module._sync_groups()
    params, buffers, states = _tables_of(module)
    values = torch.ops.shardkit_graph.pooled(
        features.values(), features.lengths(), features.weights_or_none(), params, buffers,
        states, module._graph_handle, _SEP.join(features.keys()),
    )  # fmt: skip
    return KeyedTensor(module._feature_names, module._dims, values)


# -- EmbeddingCollection -----------------------------------------------------------------------


@torch.library.custom_op("shardkit_graph::sequence", mutates_args=())
def _sequence(
    values: torch.Tensor,
    lengths: torch.Tensor,
    params: list[torch.Tensor],
    buffers: list[torch.Tensor],
    states: list[torch.Tensor],
    handle: str,
    keys: str,
) -> list[torch.Tensor]:
    module = _module(handle)
    kjt = _kjt(keys, values, None, lengths)
    with torch.no_grad():
        out = module._sequence(kjt)
    offsets = kjt.offset_per_key()
    index_of = {key: i for i, key in enumerate(kjt.keys())}
    rows = []
    for group, buffer in zip(module._stack.groups, buffers):
        group_rows = buffer.new_zeros(values.shape[0], group.tables.dim)  # [N, D] input order
        for index in group.table_indices:
            for key in module._stack.configs[index].feature_names:
                k = index_of[key]
                group_rows[offsets[k] : offsets[k + 1]] = out[key].values()
        rows.append(group_rows)
    return rows


@_sequence.register_fake
def _(values, lengths, params, buffers, states, handle, keys):
    module = _module(handle)
    return [
        buffer.new_empty(values.shape[0], group.tables.dim)
        for group, buffer in zip(module._stack.groups, buffers)
    ]


@torch.library.custom_op(
    "shardkit_graph::sequence_backward", mutates_args=("buffers", "states", "dense")
)
def _sequence_backward(
    grads: list[torch.Tensor],
    values: torch.Tensor,
    lengths: torch.Tensor,
    buffers: list[torch.Tensor],
    states: list[torch.Tensor],
    dense: list[torch.Tensor],
    handle: str,
    keys: str,
) -> None:
    module = _module(handle)
    kjt = _kjt(keys, values, None, lengths)
    with torch.no_grad():
        offsets = kjt.offset_per_key()
        index_of = {key: i for i, key in enumerate(kjt.keys())}
        kjt_in_plan, plan = module._prepare(kjt, validate=False)
        for group, spec, grad, out in zip(module._stack.groups, plan.groups, grads, dense):
            inputs = group_input(kjt_in_plan, spec)
            keys_in_plan = plan.keys[spec.first_key : spec.first_key + spec.num_keys]
            grad_out = torch.cat([grad[offsets[index_of[k]] : offsets[index_of[k] + 1]]
                                  for k in keys_in_plan])  # fmt: skip
            param_grads, _ = lookup_backward(
                group.tables, inputs.ids, None, None, grad_out, batch_size=0,
                compiled=uses_compiled_kernel(group.tables, inputs.ids),
                grad_per_sample_weights=False,
            )  # fmt: skip
            _put_dense(out, param_grads)
        _write_back(module, buffers, states)


@_sequence_backward.register_fake
def _(grads, values, lengths, buffers, states, dense, handle, keys):
    return None


def _sequence_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    values, lengths, _, buffers, states, handle, keys = inputs
    ctx.save_for_backward(values, lengths)
    ctx.buffers, ctx.states, ctx.handle, ctx.keys = buffers, states, handle, keys


def _sequence_grad(ctx: Any, grads: list[torch.Tensor]) -> tuple:
    values, lengths = ctx.saved_tensors
    grads = [g.contiguous() for g in grads]
    module = _module(ctx.handle)
    dense = _dense_outputs(module, ctx.buffers)
    torch.ops.shardkit_graph.sequence_backward(
        grads, values, lengths, ctx.buffers, ctx.states, dense, ctx.handle, ctx.keys
    )
    params = _param_grads(module, dense)
    return None, None, params, [None] * len(ctx.buffers), [None] * len(ctx.states), None, None


_sequence.register_autograd(_sequence_grad, setup_context=_sequence_setup)


def graph_sequence(module: Any, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
    """An `EmbeddingCollection`'s forward as one `shardkit_graph::sequence` call, its rows then
    cut per key at the per-key id counts (unbacked sizes: `torch.compile` with
    ``fullgraph=True``, or ``capture_scalar_outputs``)."""
    module._sync_groups()
    params, buffers, states = _tables_of(module)
    values, lengths = features.values(), features.lengths()
    rows = torch.ops.shardkit_graph.sequence(
        values, lengths, params, buffers, states, module._graph_handle,
        _SEP.join(features.keys()),
    )  # fmt: skip
    keys = features.keys()
    stride = lengths.numel() // max(len(keys), 1)
    starts, counts = ids_per_key_unbacked(features)
    index_of = {key: i for i, key in enumerate(keys)}
    out: dict[str, JaggedTensor] = {}
    for group, group_rows in zip(module._stack.groups, rows):
        for index in group.table_indices:
            for key in module._stack.configs[index].feature_names:
                k = index_of[key]
                piece = group_rows.narrow(0, starts[k], counts[k])
                out[key] = JaggedTensor(piece, lengths=lengths[k * stride : (k + 1) * stride])
    return {f: out[f] for f in module._feature_names}


# -- managed collision -------------------------------------------------------------------------


@torch.library.custom_op("shardkit_graph::remap", mutates_args=())
def _remap(
    values: torch.Tensor,
    lengths: torch.Tensor,
    handle: str,
    keys: str,
    mutate_miss_lengths: bool,
) -> torch.Tensor:
    module = _module(handle)
    kjt = _kjt(keys, values, None, lengths)
    with torch.no_grad():
        remapped = module._managed_collision_collection(kjt, mutate_miss_lengths)
        module._reset_rows(module._managed_collision_collection.evict())
    out = values.clone()  # the keys no table takes keep their ids
    index_of = {key: i for i, key in enumerate(kjt.keys())}
    starts, ends = kjt.offset_per_key(), remapped.offset_per_key()
    for i, key in enumerate(remapped.keys()):
        k = index_of[key]
        out[starts[k] : starts[k + 1]] = remapped.values()[ends[i] : ends[i + 1]]
    return out


@_remap.register_fake
def _(values, lengths, handle, keys, mutate_miss_lengths):
    return torch.empty_like(values)


def graph_remap(
    module: Any, features: KeyedJaggedTensor, mutate_miss_lengths: bool
) -> KeyedJaggedTensor:
    """A managed-collision collection's remapping as one `shardkit_graph::remap` call: the
    remapped KJT in the input's key order (see [Note: collections under torch.compile]).

    The operator also resets the rows it evicted (and their optimizer state), a write it does
    not declare: declared, it would be a write in the forward graph to the buffer the tables'
    Parameters view, which AOTAutograd refuses ("non-differentiable view input mutations"). It is
    ordered all the same: the lookup that reads those rows takes the remapped ids, so it runs
    after the operator.
    """
    values = torch.ops.shardkit_graph.remap(
        features.values(), features.lengths(), module._graph_handle, _SEP.join(features.keys()),
        mutate_miss_lengths,
    )  # fmt: skip
    return KeyedJaggedTensor(features.keys(), values, features.weights_or_none(),
                             lengths=features.lengths())  # fmt: skip


def in_key_order(features: KeyedJaggedTensor, keys: Sequence[str]) -> KeyedJaggedTensor:
    """``features`` with only ``keys``, in that order, cut at the per-key id counts as
    unbacked sizes (`torch.compile` with ``fullgraph=True``, or ``capture_scalar_outputs``)."""
    values, lengths, weights = features.values(), features.lengths(), features.weights_or_none()
    names = features.keys()
    stride = lengths.numel() // max(len(names), 1)
    starts, counts = ids_per_key_unbacked(features)
    picked = [names.index(key) for key in keys]
    pieces = [values.narrow(0, starts[k], counts[k]) for k in picked]
    weight_pieces = None if weights is None else [
        weights.narrow(0, starts[k], counts[k]) for k in picked
    ]  # fmt: skip
    return KeyedJaggedTensor(
        list(keys),
        torch.cat(pieces),
        None if weight_pieces is None else torch.cat(weight_pieces),
        lengths=torch.cat([lengths[k * stride : (k + 1) * stride] for k in picked]),
        stride=stride,
    )
