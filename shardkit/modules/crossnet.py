"""Cross networks (DCN, DCN-v2 and its low-rank mixture; ``torchrec.modules.crossnet``).

With ``x_0`` the input ``[B, N]`` and ``x_l`` layer ``l``'s input (``x_0`` for the first):

    CrossNet                x_{l+1} = x_0 * (W_l x_l + b_l) + x_l               W_l [N, N]
    LowRankCrossNet         x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l         W_l [N, r], V_l [r, N]
    VectorCrossNet          x_{l+1} = x_0 (x_l . w_l) + b_l + x_l               w_l [N]
    LowRankMixtureCrossNet  x_{l+1} = sum_k g_k(x_l) E_k(x_l) + x_l, with K experts
        E_k(x) = x_0 * (U_k a(C_k a(V_k x)) + b_l) and gates g = softmax_k(G_k x) (K > 1)

Parameters and state-dict keys are TorchRec's (``kernels.<l>``, ``W_kernels.<l>``, ...), so its
checkpoints load.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["CrossNet", "LowRankCrossNet", "LowRankMixtureCrossNet", "VectorCrossNet"]


def _params(num_layers: int, *shape: int, zeros: bool = False) -> nn.ParameterList:
    init = nn.init.zeros_ if zeros else nn.init.xavier_normal_
    return nn.ParameterList(nn.Parameter(init(torch.empty(*shape))) for _ in range(num_layers))


def _check(name: str, **values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"{name}: {key} must be >= 1, got {value}")


class CrossNet(nn.Module):
    """Full-rank cross network: ``[B, N] -> [B, N]``.

    Args:
        in_features: N.
        num_layers: the number of cross layers.
    """

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check("CrossNet", in_features=in_features, num_layers=num_layers)
        self._num_layers = num_layers
        self.kernels = _params(num_layers, in_features, in_features)
        self.bias = _params(num_layers, in_features, 1, zeros=True)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x_0 = input.unsqueeze(2)  # [B, N, 1]
        x_l = x_0
        for layer in range(self._num_layers):
            x_l = x_0 * (torch.matmul(self.kernels[layer], x_l) + self.bias[layer]) + x_l
        return x_l.squeeze(2)


class LowRankCrossNet(nn.Module):
    """DCN-v2's cross network with rank-``low_rank`` weights: ``[B, N] -> [B, N]``.

    Args:
        in_features: N.
        num_layers: the number of cross layers.
        low_rank: r.
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int = 1) -> None:
        super().__init__()
        _check("LowRankCrossNet", in_features=in_features, num_layers=num_layers,
               low_rank=low_rank)  # fmt: skip
        self._num_layers = num_layers
        self._low_rank = low_rank
        self.W_kernels = _params(num_layers, in_features, low_rank)
        self.V_kernels = _params(num_layers, low_rank, in_features)
        self.bias = _params(num_layers, in_features, zeros=True)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x_0 = x_l = input  # [B, N]
        for layer in range(self._num_layers):
            low = nn.functional.linear(x_l, self.V_kernels[layer])  # [B, r]
            x_l = x_0 * (nn.functional.linear(low, self.W_kernels[layer]) + self.bias[layer]) + x_l
        return x_l


class VectorCrossNet(nn.Module):
    """Cross network with a vector per layer (DCN-v1): ``[B, N] -> [B, N]``.

    Args:
        in_features: N.
        num_layers: the number of cross layers.
    """

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check("VectorCrossNet", in_features=in_features, num_layers=num_layers)
        self._num_layers = num_layers
        self.kernels = _params(num_layers, in_features, 1)
        self.bias = _params(num_layers, in_features, 1, zeros=True)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x_0 = input.unsqueeze(2)  # [B, N, 1]
        x_l = x_0
        for layer in range(self._num_layers):
            dot = torch.tensordot(x_l, self.kernels[layer], dims=([1], [0]))  # [B, 1, 1]
            x_l = torch.matmul(x_0, dot) + self.bias[layer] + x_l
        return x_l.squeeze(2)


class LowRankMixtureCrossNet(nn.Module):
    """DCN-v2's mixture of low-rank experts: ``[B, N] -> [B, N]``.

    Args:
        in_features: N.
        num_layers: the number of cross layers.
        num_experts: K (gated by a softmax when K > 1).
        low_rank: r.
        activation: applied inside each expert (default ``torch.relu``).
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        num_experts: int = 1,
        low_rank: int = 1,
        activation: nn.Module | Callable[[torch.Tensor], torch.Tensor] = torch.relu,
    ) -> None:
        super().__init__()
        _check("LowRankMixtureCrossNet", in_features=in_features, num_layers=num_layers,
               num_experts=num_experts, low_rank=low_rank)  # fmt: skip
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._low_rank = low_rank
        self._in_features = in_features
        self.U_kernels = _params(num_layers, num_experts, in_features, low_rank)
        self.V_kernels = _params(num_layers, num_experts, low_rank, in_features)
        self.bias = _params(num_layers, in_features, 1, zeros=True)
        self.gates = (
            nn.ModuleList(nn.Linear(in_features, 1, bias=False) for _ in range(num_experts))
            if num_experts > 1
            else None
        )
        self._activation = activation
        self.C_kernels = _params(num_layers, num_experts, low_rank, low_rank)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x_0 = input.unsqueeze(2)  # [B, N, 1]
        x_l = x_0
        for layer in range(self._num_layers):
            experts = torch.stack(
                [self._expert(layer, k, x_0, x_l) for k in range(self._num_experts)], 2
            )  # [B, N, K]
            if self.gates is None:
                x_l = experts + x_l
            else:
                gating = torch.stack([gate(x_l.squeeze(2)) for gate in self.gates], 1)  # [B, K, 1]
                x_l = torch.matmul(experts, torch.softmax(gating, 1)) + x_l
        return x_l.squeeze(2)

    def _expert(self, layer: int, k: int, x_0: torch.Tensor, x_l: torch.Tensor) -> torch.Tensor:
        low = torch.matmul(self.V_kernels[layer][k], x_l)  # [B, r, 1]
        low = torch.matmul(self.C_kernels[layer][k], self._activation(low))  # [B, r, 1]
        out = torch.matmul(self.U_kernels[layer][k], self._activation(low))  # [B, N, 1]
        return (x_0 * (out + self.bias[layer])).squeeze(2)  # [B, N]
