"""The sharded collections' id range check (`_inputs._check_ids`), one read for the batch."""

from __future__ import annotations

import re

import pytest
import torch

from shardkit.modules import EmbeddingBagConfig
from shardkit.sharding._dist._source import _check_ids

CONFIGS = [
    EmbeddingBagConfig(name=f"t{t}", embedding_dim=4, num_embeddings=10, feature_names=[f"f{t}"])
    for t in range(3)
]


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([[1, 9], [], [0, 3]], None),
        ([[], [], []], None),
        ([[1, 2], [], [3, -1, 4]], r"feature 'f2' \(table 't2'\): id -1 at position 1 of"),
        ([[1, 10, 9], [], [-1]], r"feature 'f0' \(table 't0'\): id 10 at position 1 .* = 10$"),
    ],
)
def test_check_ids_names_the_first_id_out_of_range(values, match):
    problem = _check_ids([torch.tensor(v, dtype=torch.int64) for v in values], CONFIGS)
    if match is None:
        assert problem is None
    else:
        assert problem is not None
        assert re.search(match, problem), problem
