"""Every unsharded module and model under `torch.export` with a dynamic batch size and number of
ids: the program has only torch's operators, equals eager on batches of other sizes, and refuses
a bad id (see [Note: exported lookups], [Note: serving programs] and [Note: managed collision in
an exported program])."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.inference import export_program, quantize_embeddings
from shardkit.inference._pt2 import plain
from shardkit.modules import EmbeddingCollection
from shardkit.modules.mc_modules import LFU_EvictionPolicy, MCHManagedCollisionModule
from tests.modules import pt2_models
from tests.modules.pt2_models import CASES, KEYS, tensors_of, trained

# the modules that take a KJT alone (the models take dense features too: export_program);
# the default run exports one of each kind, `pytest -m pt2_grid` all
_GRID = pytest.mark.pt2_grid
KJT_ONLY = [pytest.param("ebc", marks=_GRID), pytest.param("ebc_weighted", marks=_GRID),
            pytest.param("ebc_mean", marks=_GRID), pytest.param("ebc_weighted_mean", marks=_GRID),
            "ec",
            pytest.param("fp_ebc_dict", marks=_GRID),
            pytest.param("fp_ebc_collection", marks=_GRID)]  # fmt: skip
MODELS = ["dlrm", pytest.param("dlrm_dcn", marks=_GRID),
          pytest.param("dlrm_projection", marks=_GRID), pytest.param("deepfm", marks=_GRID)]  # fmt: skip


def _namespaces(program: torch.export.ExportedProgram) -> set[str]:
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    return {t.namespace for t in targets if isinstance(t, torch._ops.OpOverload)}


def _kjt_shapes(kjt: KeyedJaggedTensor) -> list:
    batch, ids = torch.export.Dim("batch"), torch.export.Dim("ids")
    weights = None if kjt.weights_or_none() is None else {0: ids}
    return [{0: ids}, weights, {0: len(kjt.keys()) * batch}, None]


@pytest.mark.parametrize("name", KJT_ONLY)
def test_exported_module_equals_eager(name):
    build, inputs = CASES[name]
    module = build()
    (example,) = inputs(0)
    program = torch.export.export(module, (example,), dynamic_shapes=(_kjt_shapes(example),))
    assert _namespaces(program) == {"aten"}
    for seed, batch in ((1, 3), (2, 7), (3, 2)):
        weighted = example.weights_or_none() is not None
        kjt = pt2_models.kjt(seed, batch=batch, weighted=weighted)
        for got, want in zip(
            tensors_of(program.module()(kjt)), tensors_of(module(kjt)), strict=True
        ):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", MODELS)
def test_exported_model_equals_eager(name):
    """A model as its serving program: plain tensors in, logits out, any batch size."""
    model = CASES[name][0]().eval()
    program = export_program(model, KEYS, pt2_models.DENSE_IN)
    assert _namespaces(program) == {"aten"}
    for seed, batch in ((1, 3), (2, 9), (3, 1)):  # a batch of one too
        kjt, dense = pt2_models.kjt(seed, batch=batch), pt2_models.dense(seed, batch)
        got = program.module()(dense, kjt.values(), kjt.lengths())
        torch.testing.assert_close(got, model(dense, kjt))


@pytest.mark.parametrize("dtype", [pytest.param(torch.qint8, marks=_GRID), torch.quint4x2])
def test_quantized_tables_export(dtype):
    """INT8 and INT4 tables export to torch's quantized operators (INT4 through the meta
    kernel shardkit registers: [Note: quantized operators under torch.export])."""
    model = quantize_embeddings(pt2_models.dlrm(), dtype=dtype, inplace=True).eval()
    program = export_program(model, KEYS, pt2_models.DENSE_IN)
    assert _namespaces(program) == {"aten", "quantized"}
    for batch in (6, 1):
        kjt, dense = pt2_models.kjt(4, batch=batch), pt2_models.dense(4, batch)
        torch.testing.assert_close(program.module()(dense, kjt.values(), kjt.lengths()),
                                   model(dense, kjt))  # fmt: skip


def test_exported_program_refuses_a_bad_id():
    module = pt2_models.ebc()
    (example,) = CASES["ebc"][1](0)
    program = torch.export.export(module, (example,), dynamic_shapes=(_kjt_shapes(example),))
    bad = KeyedJaggedTensor.concat([pt2_models.kjt(1, keys=["c", "a", "x"]),
                                    pt2_models.kjt(1, keys=["b"], offset=70)])  # fmt: skip
    with pytest.raises(RuntimeError, match=r"feature 'b' \(table 't1'\): an id is out of range"):
        program.module()(bad)
    quantized = quantize_embeddings(copy.deepcopy(module), dtype=torch.qint8, inplace=True)
    program = torch.export.export(quantized, (example,), dynamic_shapes=(_kjt_shapes(example),))
    with pytest.raises(RuntimeError, match=r"feature 'b': an id is outside its table of 7 rows"):
        program.module()(bad)


def test_exported_program_refuses_lengths_that_do_not_cover_the_values():
    module = pt2_models.ebc()
    (example,) = CASES["ebc"][1](0)
    program = torch.export.export(module, (example,), dynamic_shapes=(_kjt_shapes(example),))
    short = KeyedJaggedTensor(KEYS, torch.zeros(5, dtype=torch.int64),
                              lengths=torch.ones(8, dtype=torch.int64))  # fmt: skip
    with pytest.raises(RuntimeError, match="the lengths do not sum to the number of values"):
        program.module()(short)


def test_a_bag_longer_than_its_position_weights_is_refused_in_a_graph():
    """The position-weight check of the traced path (compile and export) names the feature."""
    module = pt2_models.fp_ebc(collection=True)
    long_bag = KeyedJaggedTensor(KEYS, torch.zeros(9, dtype=torch.int64),
                                 lengths=torch.tensor([1, 0, 0, 0, 1, 1, 5, 1]))  # fmt: skip
    runner = torch.compile(module, backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError, match=r"position weights of feature 'b': a bag has more ids "
                       r"than max_feature_length \(4\)"):  # fmt: skip
        runner(long_bag)


def test_a_graph_that_outlives_its_collection_says_so():
    values, lengths = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="no live embedding collection has handle 'gone'"):
        torch.ops.shardkit_graph.pooled(values, lengths, None, [], [], [], "gone", "a")


def _mc_ebc_bucketed() -> torch.nn.Module:
    """An MC-EBC whose remappers split their rows into buckets (the search sorts the slots
    over all buckets) and hash the ids first."""
    module = pt2_models.mc_ebc(remapped=True)
    for name, config in module._configs.items():
        mch = MCHManagedCollisionModule(
            config.num_embeddings, "cpu", LFU_EvictionPolicy(), 2, name=name, buckets=2,
            input_hash_size=30, input_hash_func=lambda ids, size: (ids * 7) % size,
        )  # fmt: skip
        module._managed_collision_collection._managed_collision_modules[name] = mch
    return module


MC_CASES = {
    "mc_ebc": CASES["mc_ebc"][0],
    "mc_ebc_remapped": CASES["mc_ebc_remapped"][0],
    "mc_ec": CASES["mc_ec"][0],
    "mc_ebc_bucketed": _mc_ebc_bucketed,
}


# the default run: the bucketed MC-EBC (hashed ids, slots sorted over buckets, remapped KJT out)
MC_EXPORTS = [pytest.param("mc_ebc", marks=_GRID), pytest.param("mc_ebc_remapped", marks=_GRID),
              pytest.param("mc_ec", marks=_GRID), "mc_ebc_bucketed"]  # fmt: skip


@pytest.mark.parametrize("name", MC_EXPORTS)
def test_managed_collision_exports_in_eval_mode(name):
    """The remapping exports as aten operators reading the slot buffers (no shardkit operator,
    no host read), and the program equals eager on batches of other sizes, ids that hold a
    row and ids that do not among them."""
    module = trained(MC_CASES[name]())
    (example,) = CASES["mc_ebc"][1](0)
    program = torch.export.export(module, (example,), dynamic_shapes=(_kjt_shapes(example),))
    assert _namespaces(program) == {"aten"}
    served = program.module()
    # the search reads the program's slot buffers: a remapper state loaded into it is served
    later = trained(MC_CASES[name](), offset=20).state_dict()
    slots = {k: v for k, v in later.items() if "._managed_collision_modules." in k}
    assert not any(torch.equal(v, module.state_dict()[k]) for k, v in slots.items()
                   if k.endswith("_mch_sorted_raw_ids"))  # fmt: skip
    served.load_state_dict(slots, strict=False)
    module.load_state_dict(slots, strict=False)
    misses = hits = 0
    for seed, batch in ((1, 3), (2, 7)):
        kjt = pt2_models.kjt(seed, batch=batch, rows=40)
        for got, want in zip(tensors_of(served(kjt)), tensors_of(module(kjt)), strict=True):
            torch.testing.assert_close(got, want)
        held = _held(module, kjt.values())
        hits, misses = hits + int(held.sum()), misses + int((~held).sum())
    assert hits and misses  # the batches exercise both


def _held(module: torch.nn.Module, values: torch.Tensor) -> torch.Tensor:
    """``[N]`` whether some remapper of ``module`` holds the id (after its hash)."""
    held = torch.zeros_like(values, dtype=torch.bool)
    for mch in module._managed_collision_collection._managed_collision_modules.values():
        hashed = mch._input_hash_func
        ids = values if hashed is None else hashed(values, mch._input_hash_size)
        held |= torch.isin(ids, mch._mch_sorted_raw_ids)
    return held


def test_managed_collision_export_in_training_mode_is_refused():
    module = pt2_models.mc_ebc()
    (example,) = CASES["mc_ebc"][1](0)
    with pytest.raises(ValueError, match=r"in training mode: its remapper records every batch's "
                       r"ids .* call \.eval\(\) before exporting"):  # fmt: skip
        torch.export.export(module, (example,), dynamic_shapes=(_kjt_shapes(example),))


@pytest.mark.parametrize("dtype", [pytest.param(torch.qint8, marks=_GRID), torch.quint4x2])
def test_quantized_embedding_collection_exports(dtype):
    """A quantized EC's program (ids alone in, through `export_program`) cuts the rows per key
    with the per-key counts as unbacked sizes, not the host's length_per_key; equal to eager
    for any batch, one included."""
    module = quantize_embeddings(pt2_models.ec(), dtype=dtype, inplace=True,
                                 additional_qconfig_spec_keys=[EmbeddingCollection]).eval()  # fmt: skip
    program = export_program(module, KEYS, None)
    assert _namespaces(program) == {"aten", "quantized"}
    for seed, batch in ((4, 6), (5, 1)):
        kjt = pt2_models.kjt(seed, batch=batch)
        got = program.module()(kjt.values(), kjt.lengths())
        for a, b in zip(got, plain(module(kjt)), strict=True):
            torch.testing.assert_close(a, b)
