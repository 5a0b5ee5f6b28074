"""The issue's two PT2 checks side by side with TorchRec 1.8 (peers venv; the pt2_grid tier): the
same model (an EmbeddingBagCollection of one 1,000 x 32 table and a Linear, the same weights)
under `torch._dynamo.explain` with dynamo's default config, and under `torch.export` with a
dynamic batch and number of ids, the exported module against eager on another batch."""

from __future__ import annotations

import pytest
import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from tests.compat.peers import run_in_torchrec

pytestmark = pytest.mark.pt2_grid

_TORCHREC = """
import torch
import torchrec
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
            name="t", embedding_dim=32, num_embeddings=1000, feature_names=["f"])])
        self.linear = torch.nn.Linear(32, 1)

    def forward(self, kjt):
        return self.linear(self.ebc(kjt).values())

model = Model()
model.load_state_dict(inputs["state"])
def kjt(b):
    return KeyedJaggedTensor(["f"], b["values"], lengths=b["lengths"])
torch._dynamo.reset()
found = torch._dynamo.explain(model)(kjt(inputs["first"]))
outputs["breaks"] = found.graph_break_count
ids, batch = torch.export.Dim("ids"), torch.export.Dim("batch")
program = torch.export.export(model, (kjt(inputs["first"]),),
                              dynamic_shapes=([{0: ids}, None, {0: batch}, None, None, None],))
outputs["exported"] = program.module()(kjt(inputs["second"])).detach()
outputs["eager"] = model(kjt(inputs["second"])).detach()
"""


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
            name="t", embedding_dim=32, num_embeddings=1000, feature_names=["f"])])  # fmt: skip
        self.linear = torch.nn.Linear(32, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.linear(self.ebc(kjt).values())


def _batch(seed: int, batch: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (batch,), generator=g)
    return {"values": torch.randint(0, 1000, (int(lengths.sum()),), generator=g),
            "lengths": lengths}  # fmt: skip


def test_graph_breaks_and_export_against_torchrec(tmp_path):
    torch.manual_seed(0)
    model = _Model()
    first, second = _batch(1, 4), _batch(2, 9)
    theirs = run_in_torchrec(_TORCHREC, {"state": model.state_dict(), "first": first,
                                         "second": second}, tmp_path)  # fmt: skip

    def kjt(b: dict[str, torch.Tensor]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(["f"], b["values"], lengths=b["lengths"])

    torch._dynamo.reset()
    ours = torch._dynamo.explain(model)(kjt(first)).graph_break_count
    ids, batch = torch.export.Dim("ids"), torch.export.Dim("batch")
    program = torch.export.export(model, (kjt(first),),
                                  dynamic_shapes=([{0: ids}, None, {0: batch}, None],))  # fmt: skip
    torch.testing.assert_close(theirs["exported"], theirs["eager"])
    eager = model(kjt(second))
    torch.testing.assert_close(program.module()(kjt(second)), eager)
    torch.testing.assert_close(eager.detach(), theirs["eager"], msg="same model, same weights")
    # TorchRec 1.8: 4 breaks under the default config (KeyedJaggedTensor.to_dict's .tolist())
    print(f"graph breaks, dynamo's default config: TorchRec {theirs['breaks']}, shardkit {ours}")
    assert ours == 0 and theirs["breaks"] >= ours
