"""Perceptrons and multi-layer perceptrons (``torchrec.modules.mlp``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from shardkit.modules.activation import SwishLayerNorm
from shardkit.modules.utils import extract_module_or_tensor_callable

__all__ = ["MLP", "Perceptron"]

Activation = nn.Module | Callable[[torch.Tensor], torch.Tensor]


class Perceptron(nn.Module):
    """A linear layer and an activation: ``[B, in_size] -> [B, out_size]``.

    Args:
        in_size: input features.
        out_size: output features.
        bias: whether the linear layer has a bias.
        activation: a module or a function of one tensor (default ``torch.relu``).
        device: where the parameters live.
        dtype: the parameters' dtype.

    State dict: ``_linear.weight``, ``_linear.bias`` (TorchRec's keys), plus the activation's
    parameters, if it is a module with some, under ``_activation_fn``.
    """

    def __init__(
        self,
        in_size: int,
        out_size: int,
        bias: bool = True,
        activation: Activation = torch.relu,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self._in_size = in_size
        self._out_size = out_size
        self._linear = nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
        self._activation_fn = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``[B, in_size] -> [B, out_size]``."""
        return self._activation_fn(self._linear(input))


class MLP(nn.Module):
    """Perceptrons in sequence: ``[B, in_size] -> [B, layer_sizes[-1]]``.

    Args:
        in_size: input features.
        layer_sizes: each perceptron's output size.
        bias: whether the linear layers have biases.
        activation: ``"relu"``, ``"sigmoid"``, ``"swish_layernorm"`` (a `SwishLayerNorm` per
            layer), a module, a function of one tensor, or a function of no arguments that
            makes a new module for each layer (parameters not shared).
        device: where the parameters live.
        dtype: the parameters' dtype.
        activation_on_last: apply the activation after the last layer too (default True).

    State dict: ``_mlp.<i>._linear.weight`` ... (TorchRec's keys).
    """

    def __init__(
        self,
        in_size: int,
        layer_sizes: Sequence[int],
        bias: bool = True,
        activation: str | Activation | Callable[[], nn.Module] = torch.relu,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        activation_on_last: bool = True,
    ) -> None:
        super().__init__()
        if not layer_sizes:
            raise ValueError("MLP: layer_sizes must name at least one layer, got []")
        if isinstance(activation, str) and activation not in _NAMED:
            raise ValueError(
                f"MLP: activation {activation!r} is not one of {sorted(_NAMED)}; pass a module "
                "or a function instead"
            )
        layers = []
        for index, out_size in enumerate(layer_sizes):
            last = index == len(layer_sizes) - 1
            act = (
                nn.Identity()
                if last and not activation_on_last
                else _activation(activation, out_size, device)
            )
            in_features = layer_sizes[index - 1] if index else in_size
            layers.append(
                Perceptron(
                    in_features, out_size, bias=bias, activation=act, device=device, dtype=dtype
                )
            )
        self._mlp = nn.Sequential(*layers)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``[B, in_size] -> [B, layer_sizes[-1]]``."""
        return self._mlp(input)


_NAMED = {"relu", "sigmoid", "swish_layernorm"}


def _activation(activation: object, size: int, device: torch.device | None) -> Activation:
    if activation == "relu":
        return torch.relu
    if activation == "sigmoid":
        return torch.sigmoid
    if activation == "swish_layernorm":
        return SwishLayerNorm(size, device=device)
    return extract_module_or_tensor_callable(activation)  # type: ignore[arg-type]
