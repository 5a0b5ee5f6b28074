"""DLRM's variants and DeepFM with TorchRec's layout: formulas and errors, and (optional tier)
TorchRec checkpoints of each model loading into ours with the same outputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.models.deepfm import SimpleDeepFMNN
from shardkit.models.dlrm import (
    DLRM,
    DLRM_DCN,
    DLRM_Projection,
    DLRMWrapper,
    InteractionProjectionArch,
    OverArch,
    choose,
)
from tests.compat.peers import run_in_torchrec

B, F, D = 4, 3, 4


def _ebc() -> EmbeddingBagCollection:
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=10,
                               feature_names=[f"f{i}"])
            for i in range(F)
        ]
    )  # fmt: skip


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (F * B,), generator=g)
    return {
        "dense": torch.randn(B, 5, generator=g),
        "values": torch.randint(0, 10, (int(lengths.sum()),), generator=g),
        "lengths": lengths,
    }


def _kjt(inputs) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=[f"f{i}" for i in range(F)], values=inputs["values"],
                             lengths=inputs["lengths"])  # fmt: skip


_MODELS = {
    "dlrm": lambda ebc: DLRM(ebc, 5, [8, D], [6, 1]),
    "dcn": lambda ebc: DLRM_DCN(ebc, 5, [8, D], [6, 1], dcn_num_layers=2, dcn_low_rank_dim=3),
    "projection": lambda ebc: DLRM_Projection(ebc, 5, [8, D], [6, 1], [8, 2 * D], [8, 3 * D]),
    "deepfm": lambda ebc: SimpleDeepFMNN(5, ebc, hidden_layer_size=6, deep_fm_dimension=3),
}


def test_choose():
    assert [choose(5, k) for k in range(-1, 7)] == [0, 1, 5, 10, 10, 5, 1, 0]


def test_projection_interaction_formula():
    torch.manual_seed(0)
    branch1, branch2 = torch.nn.Linear(8, 2 * 2), torch.nn.Linear(8, 3 * 2)
    arch = InteractionProjectionArch(3, branch1, branch2)
    dense, sparse = torch.randn(5, 2), torch.randn(5, 3, 2)
    flat = torch.cat([dense.unsqueeze(1), sparse], 1).reshape(5, -1)
    products = torch.bmm(branch1(flat).reshape(5, 2, 2), branch2(flat).reshape(5, 2, 3))
    torch.testing.assert_close(arch(dense, sparse), torch.cat([dense, products.reshape(5, 6)], 1))


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_each_model_gives_one_output_per_example_and_trains(name):
    torch.manual_seed(0)
    model = _MODELS[name](_ebc())
    inputs = _inputs()
    labels = (inputs["dense"][:, 0] > 0).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(25):
        out = model(inputs["dense"], _kjt(inputs)).squeeze(1)
        assert out.shape == (B,)
        loss = (torch.nn.functional.binary_cross_entropy(out, labels) if name == "deepfm"
                else torch.nn.functional.binary_cross_entropy_with_logits(out, labels))  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    if name == "deepfm":
        assert out.min() >= 0 and out.max() <= 1  # TorchRec's DeepFM ends with a sigmoid


def test_errors_name_the_sizes():
    with pytest.raises(ValueError, match=r"over_arch_layer_sizes \[1\]: the over arch needs at "
                       r"least two layers"):  # fmt: skip
        OverArch(4, [1])
    with pytest.raises(ValueError, match=r"interaction_branch2_layer_sizes \[8, 5\] must end with "
                       r"a multiple of the embedding dim 4"):  # fmt: skip
        DLRM_Projection(_ebc(), 5, [8, D], [6, 1], [8, D], [8, 5])


def test_wrapper_takes_torchrecs_model_input():
    torch.manual_seed(0)
    model = DLRMWrapper(_ebc(), 5, [8, D], [6, 1])
    inputs = _inputs()
    batch = SimpleNamespace(float_features=inputs["dense"], idlist_features=_kjt(inputs),
                            label=torch.ones(B))  # fmt: skip
    loss, logits = model(batch)
    assert loss.dim() == 0 and logits.shape == (B, 1)
    assert model.eval()(batch).shape == (B, 1)


_TORCHREC = """
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection
B, F, D = 4, 3, 4
def ebc():
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=10, feature_names=[f"f{i}"])
        for i in range(F)])
made = {
    "dlrm": lambda: DLRM(ebc(), 5, [8, D], [6, 1]),
    "dcn": lambda: DLRM_DCN(ebc(), 5, [8, D], [6, 1], dcn_num_layers=2, dcn_low_rank_dim=3),
    "projection": lambda: DLRM_Projection(ebc(), 5, [8, D], [6, 1], [8, 2 * D], [8, 3 * D]),
    "deepfm": lambda: SimpleDeepFMNN(5, ebc(), hidden_layer_size=6, deep_fm_dimension=3),
}
kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(F)], values=inputs["values"],
                        lengths=inputs["lengths"])
for name, make in made.items():
    torch.manual_seed(0)
    model = make()
    outputs[name] = (model.state_dict(), model(inputs["dense"], kjt))
"""


@pytest.fixture(scope="module")
def torchrec_models(tmp_path_factory):
    inputs = _inputs(3)
    return inputs, run_in_torchrec(_TORCHREC, inputs, tmp_path_factory.mktemp("peer"))


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_torchrec_checkpoints_load_and_give_the_same_output(torchrec_models, name):
    inputs, theirs = torchrec_models
    state, expected = theirs[name]
    ours = _MODELS[name](_ebc())
    assert sorted(ours.state_dict()) == sorted(state)
    ours.load_state_dict(state, strict=True)
    torch.testing.assert_close(ours(inputs["dense"], _kjt(inputs)), expected)
