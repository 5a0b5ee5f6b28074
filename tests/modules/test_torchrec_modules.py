"""TorchRec's dense modules (MLP, cross nets, DeepFM's halves, SwishLayerNorm, utils): their
formulas, their errors, and (optional tier) TorchRec's own modules' state dicts loaded into
ours giving the same outputs."""

from __future__ import annotations

import pytest
import torch

from shardkit.compat import NotInShardkitError
from shardkit.modules.activation import SwishLayerNorm
from shardkit.modules.crossnet import (
    CrossNet,
    LowRankCrossNet,
    LowRankMixtureCrossNet,
    VectorCrossNet,
)
from shardkit.modules.deepfm import DeepFM, FactorizationMachine
from shardkit.modules.mlp import MLP, Perceptron
from shardkit.modules.utils import (
    check_module_output_dimension,
    construct_modulelist_from_single_module,
    convert_list_of_modules_to_modulelist,
    deterministic_dedup,
    extract_module_or_tensor_callable,
)
from tests.compat.peers import run_in_torchrec


def test_mlp_is_linear_layers_with_the_activation():
    torch.manual_seed(0)
    mlp = MLP(4, [5, 3], activation_on_last=False)
    x = torch.randn(2, 4)
    layers = [p._linear for p in mlp._mlp]
    expected = layers[1](torch.relu(layers[0](x)))
    torch.testing.assert_close(mlp(x), expected)
    assert sorted(mlp.state_dict()) == [
        "_mlp.0._linear.bias", "_mlp.0._linear.weight", "_mlp.1._linear.bias",
        "_mlp.1._linear.weight",
    ]  # fmt: skip


def test_activation_factories_make_one_module_per_layer():
    mlp = MLP(3, [3, 3], activation=torch.nn.PReLU)
    first, second = (p._activation_fn for p in mlp._mlp)
    assert isinstance(first, torch.nn.PReLU) and first is not second
    shared = torch.nn.PReLU()
    mlp = MLP(3, [3, 3], activation=shared)
    assert all(p._activation_fn is shared for p in mlp._mlp)
    assert extract_module_or_tensor_callable(torch.tanh) is torch.tanh
    with pytest.raises(ValueError, match=r"activation 'gelu' is not one of \['relu', 'sigmoid', "):
        MLP(3, [2], activation="gelu")
    with pytest.raises(ValueError, match=r"must return a torch.nn.Module, got int"):
        extract_module_or_tensor_callable(lambda: 3)


def test_swish_layernorm_formula():
    x = torch.randn(3, 4)
    sln = SwishLayerNorm(4)
    torch.testing.assert_close(sln(x), x * torch.sigmoid(torch.nn.functional.layer_norm(x, (4,))))


def test_cross_net_formulas():
    torch.manual_seed(0)
    x0 = torch.randn(3, 5)
    net = CrossNet(5, 2)
    x = x0
    for w, b in zip(net.kernels, net.bias):
        x = x0 * (x @ w.T + b.squeeze(1)) + x
    torch.testing.assert_close(net(x0), x)
    low = LowRankCrossNet(5, 2, low_rank=2)
    x = x0
    for w, v, b in zip(low.W_kernels, low.V_kernels, low.bias):
        x = x0 * (x @ v.T @ w.T + b) + x
    torch.testing.assert_close(low(x0), x)
    vec = VectorCrossNet(5, 2)
    x = x0
    for w, b in zip(vec.kernels, vec.bias):
        x = x0 * (x @ w) + b.squeeze(1) + x
    torch.testing.assert_close(vec(x0), x)


def test_mixture_of_one_expert_is_a_low_rank_cross_net_with_activations():
    torch.manual_seed(0)
    x0 = torch.randn(3, 5)
    net = LowRankMixtureCrossNet(5, 2, num_experts=1, low_rank=2, activation=torch.nn.Identity())
    x = x0
    for u, v, c, b in zip(net.U_kernels, net.V_kernels, net.C_kernels, net.bias):
        x = x0 * (x @ v[0].T @ c[0].T @ u[0].T + b.squeeze(1)) + x
    torch.testing.assert_close(net(x0), x)
    assert net.gates is None and LowRankMixtureCrossNet(5, 1, num_experts=2).gates is not None
    with pytest.raises(
        ValueError, match=r"LowRankMixtureCrossNet: num_experts must be >= 1, got 0"
    ):
        LowRankMixtureCrossNet(5, 1, num_experts=0)


def test_deepfm_halves():
    torch.manual_seed(0)
    embeddings = [torch.randn(2, 3, 4), torch.randn(2, 5)]
    flat = torch.cat([embeddings[0].flatten(1), embeddings[1]], 1)
    fm = FactorizationMachine()(embeddings)
    pairs = sum(flat[:, i] * flat[:, j] for i in range(17) for j in range(i + 1, 17))
    torch.testing.assert_close(fm.squeeze(1), pairs)
    dense = torch.nn.Linear(17, 1)
    torch.testing.assert_close(DeepFM(dense)(embeddings), dense(flat))


def test_utils():
    stack = construct_modulelist_from_single_module(torch.nn.Linear(2, 2), (2, 3))
    assert len(stack) == 2 and len(stack[0]) == 3
    assert stack[0][0].weight is not stack[0][1].weight
    assert float(stack[1][2].bias.detach().abs().sum()) == 0.0
    assert check_module_output_dimension([torch.nn.Linear(2, 4), torch.nn.Linear(2, 4)], 2, 4)
    nested = convert_list_of_modules_to_modulelist([[torch.nn.ReLU()], [torch.nn.Tanh()]], (2, 1))
    assert isinstance(nested[1][0], torch.nn.Tanh)
    with pytest.raises(ValueError, match=r"3 module\(s\) at a level where sizes \[2\] asks for 2"):
        convert_list_of_modules_to_modulelist([torch.nn.ReLU()] * 3, (2,))
    unique, last = deterministic_dedup(torch.tensor([5, 2, 5, 7, 2, 5]))
    assert unique.tolist() == [2, 5, 7] and last.tolist() == [4, 5, 3]
    with pytest.raises(NotInShardkitError, match=r"has no construct_jagged_tensors: internal"):
        from shardkit.modules.utils import construct_jagged_tensors  # noqa: F401


_TORCHREC = """
from torchrec.modules.activation import SwishLayerNorm
from torchrec.modules.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from torchrec.modules.deepfm import DeepFM, FactorizationMachine
from torchrec.modules.mlp import MLP, Perceptron
torch.manual_seed(0)
x = inputs["x"]
made = {
    "mlp": MLP(5, [6, 3]),
    "mlp_swish": MLP(5, [6, 3], activation="swish_layernorm", activation_on_last=False),
    "perceptron": Perceptron(5, 2, bias=False),
    "swish": SwishLayerNorm(5),
    "crossnet": CrossNet(5, 2),
    "lowrank": LowRankCrossNet(5, 2, 3),
    "vector": VectorCrossNet(5, 2),
    "mixture": LowRankMixtureCrossNet(5, 2, num_experts=3, low_rank=2),
}
for name, module in made.items():
    outputs[name] = (module.state_dict(), module(x))
deepfm = DeepFM(MLP(5, [1]))
outputs["deepfm"] = (deepfm.state_dict(), deepfm([x[:, :2], x[:, 2:]]))
outputs["fm"] = ({}, FactorizationMachine()([x[:, :2], x[:, 2:]]))
"""


@pytest.fixture(scope="module")
def torchrec_modules(tmp_path_factory):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    return x, run_in_torchrec(_TORCHREC, {"x": x}, tmp_path_factory.mktemp("peer"))


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("mlp", lambda: MLP(5, [6, 3])),
        ("mlp_swish", lambda: MLP(5, [6, 3], activation="swish_layernorm", activation_on_last=False)),
        ("perceptron", lambda: Perceptron(5, 2, bias=False)),
        ("swish", lambda: SwishLayerNorm(5)),
        ("crossnet", lambda: CrossNet(5, 2)),
        ("lowrank", lambda: LowRankCrossNet(5, 2, 3)),
        ("vector", lambda: VectorCrossNet(5, 2)),
        ("mixture", lambda: LowRankMixtureCrossNet(5, 2, num_experts=3, low_rank=2)),
        ("deepfm", lambda: DeepFM(MLP(5, [1]))),
        ("fm", FactorizationMachine),
    ],
)  # fmt: skip
def test_torchrec_state_dicts_load_and_give_the_same_output(torchrec_modules, name, make):
    x, theirs = torchrec_modules
    state, expected = theirs[name]
    ours = make()
    ours.load_state_dict(state, strict=True)
    got = ours([x[:, :2], x[:, 2:]]) if name in ("deepfm", "fm") else ours(x)
    torch.testing.assert_close(got, expected)
