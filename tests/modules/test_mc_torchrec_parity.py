"""`MCHManagedCollisionModule` with one bucket against TorchRec's own, run in the TorchRec venv
(skipped where it is not installed): the same rows, evictions and state, batch after batch."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from shardkit import EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
    average_threshold_filter,
)

TORCHREC_PYTHON = Path(
    os.environ.get("SHARDKIT_TORCHREC_PYTHON", "~/.cache/shardkit-peers/venv/bin/python")
).expanduser()
REFERENCE = Path(__file__).with_name("torchrec_mc_reference.py")


def _cases() -> list[dict]:
    g = torch.Generator().manual_seed(1)
    cases = []
    for kind in ("lfu", "lru", "dlfu"):
        for interval in (1, 3):
            for threshold in (None, "average"):
                batches = [
                    (torch.randint(0, 40, (10,), generator=g) ** 2 + 2**35,
                     torch.tensor([3, 2, 0, 1, 2, 2]))
                    for _ in range(12)
                ]  # fmt: skip
                cases.append({"name": f"{kind}-{interval}-{threshold}", "policy": kind,
                              "decay": 1.5, "interval": interval, "zch": 16, "filter": threshold,
                              "batches": batches})  # fmt: skip
    return cases


def _shardkit(case: dict) -> dict:
    kinds = {"lfu": LFU_EvictionPolicy, "lru": LRU_EvictionPolicy, "dlfu": DistanceLFU_EvictionPolicy}  # fmt: skip
    kwargs = {} if case["policy"] == "lfu" else {"decay_exponent": case["decay"]}
    threshold = average_threshold_filter if case["filter"] else None
    policy = kinds[case["policy"]](threshold_filtering_func=threshold, **kwargs)
    tables = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=case["zch"],
                                 feature_names=["f0", "f1"])]  # fmt: skip
    module = MCHManagedCollisionModule(case["zch"], "cpu", policy, case["interval"])
    mcc = ManagedCollisionCollection({"t": module}, tables)
    rows, evicted = [], []
    for values, lengths in case["batches"]:
        rows.append(mcc(KeyedJaggedTensor(keys=["f0", "f1"], values=values, lengths=lengths)).values())  # fmt: skip
        evicted.append(module.evict())
    return {"rows": rows, "evicted": evicted, "state": module.state_dict()}


@pytest.mark.skipif(
    not TORCHREC_PYTHON.exists(), reason="needs TorchRec (SHARDKIT_TORCHREC_PYTHON)"
)
def test_same_rows_evictions_and_state_as_torchrec(tmp_path):
    cases = _cases()
    torch.save(cases, tmp_path / "cases.pt")
    subprocess.run(
        [str(TORCHREC_PYTHON), str(REFERENCE), str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    expected = torch.load(tmp_path / "out.pt")
    for case in cases:
        ours, theirs = _shardkit(case), expected[case["name"]]
        for step, (mine, ref) in enumerate(zip(ours["rows"], theirs["rows"])):
            torch.testing.assert_close(mine, ref, msg=f"{case['name']}, batch {step}: rows")
        for mine, ref in zip(ours["evicted"], theirs["evicted"]):
            assert (mine is None) == (ref is None)
            if ref is not None:
                torch.testing.assert_close(mine, torch.unique(ref))
        assert any(e is not None and e.numel() for e in ours["evicted"])
        assert ours["state"].keys() == theirs["state"].keys()
        for key, value in theirs["state"].items():
            torch.testing.assert_close(ours["state"][key], value, msg=f"{case['name']}: {key}")
