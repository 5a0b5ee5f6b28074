"""TorchRec's serving interfaces (``torchrec.inference.modules``): a `PredictModule` wraps a
model so that a server calls it with a batch dict, a `PredictFactory` builds one and describes
its inputs (`BatchingMetadata`) and methods (`QualNameMetadata`), and `quantize_dense` /
`quantize_feature` run the dense part in float16.

shardkit has no TorchScript/torch.deploy server: these run in a plain Python process (a server
of your own calls ``predict_module(batch)``), with TorchRec's semantics.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from shardkit.modules.embedding_modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
)

__all__ = [
    "BatchingMetadata",
    "PredictFactory",
    "PredictModule",
    "QualNameMetadata",
    "quantize_dense",
    "quantize_feature",
]


@dataclass
class QualNameMetadata:
    """What a server needs to know about one method of the predict module."""

    need_preproc: bool


@dataclass
class BatchingMetadata:
    """How a server batches one input of the predict module.

    Args:
        type: the input's batching kind (TorchRec's ``"dense"``, ``"sparse"``, ...).
        device: ``"cpu"`` or ``"cuda"``.
        pinned: suffixes of the tensors to deserialize to pinned memory (``""``: all).
    """

    type: str
    device: str
    pinned: list[str]


class PredictFactory(abc.ABC):
    """Builds the model (with trained weights) a server runs, and describes its inputs."""

    @abc.abstractmethod
    def create_predict_module(self) -> nn.Module:
        """The predict module, weights loaded (sharded if the process group is set up)."""

    @abc.abstractmethod
    def batching_metadata(self) -> dict[str, BatchingMetadata]:
        """``{input name: BatchingMetadata}``."""

    def batching_metadata_json(self) -> str:
        """`batching_metadata` as JSON."""
        return json.dumps({k: asdict(v) for k, v in self.batching_metadata().items()})

    @abc.abstractmethod
    def result_metadata(self) -> str:
        """A string naming the result type (used to split results)."""

    @abc.abstractmethod
    def run_weights_independent_tranformations(self, predict_module: nn.Module) -> nn.Module:
        """Transformations that do not read weights (tracing, splitting); TorchRec's spelling."""

    @abc.abstractmethod
    def run_weights_dependent_transformations(self, predict_module: nn.Module) -> nn.Module:
        """Transformations that read weights (lowering to a backend)."""

    def qualname_metadata(self) -> dict[str, QualNameMetadata]:
        """``{method name: QualNameMetadata}``; none by default."""
        return {}

    def qualname_metadata_json(self) -> str:
        """`qualname_metadata` as JSON."""
        return json.dumps({k: asdict(v) for k, v in self.qualname_metadata().items()})

    def model_inputs_data(self) -> dict[str, Any]:
        """Data for generating benchmark inputs; none by default."""
        return {}


class PredictModule(nn.Module):
    """A model as a server calls it: ``forward(batch)`` runs `predict_forward` (yours: turn the
    batch dict into the model's inputs) in ``torch.inference_mode``; the model is put in eval.

    Args:
        module: the model.
        device: the device inputs go to; unset: the current CUDA device if there is one, else
            the CPU (TorchRec assumes CUDA).
    """

    def __init__(self, module: nn.Module, device: str | None = None) -> None:
        super().__init__()
        self._module = module
        self._device = torch.device(device) if device else None
        self._module.eval()

    @property
    def predict_module(self) -> nn.Module:
        return self._module

    @property
    def device(self) -> torch.device:
        if self._device is None:
            cuda = torch.cuda.is_available()
            self._device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
            self._device = self._device or torch.device("cpu")
        return self._device

    @abc.abstractmethod
    def predict_forward(self, batch: dict[str, torch.Tensor]) -> Any:
        """The model's outputs for ``batch``."""

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        _ = self.device
        with torch.inference_mode():
            return self.predict_forward(batch)

    def state_dict(  # type: ignore[override]
        self, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> dict[str, Any]:
        """The wrapped model's ``state_dict`` (no ``_module.`` prefix), as TorchRec's."""
        return self._module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)


def quantize_feature(module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """A forward pre-hook: float32/float64 tensor inputs as float16, others unchanged."""
    return tuple(
        x.half() if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64) else x
        for x in inputs
    )


def quantize_dense(
    predict_module: PredictModule,
    dtype: torch.dtype,
    additional_embedding_module_type: Sequence[type[nn.Module]] = (),
) -> PredictModule:
    """Every child of the predict module's model that is not an embedding collection (nor of
    ``additional_embedding_module_type``) in float16, its inputs cast by `quantize_feature`.

    Raises:
        ValueError: ``dtype`` other than ``torch.half`` (TorchRec supports only that too).
    """
    if dtype != torch.half:
        raise ValueError(
            f"quantize_dense lowers dense modules to torch.half only, got {dtype}; quantize "
            "nn.Linear layers to int8 with torch.ao.quantization.quantize_dynamic instead"
        )
    skip = tuple(additional_embedding_module_type)
    for child in predict_module.predict_module.children():
        if not _is_embedding(child, skip):
            _half_except_embeddings(child, skip)
            child.register_forward_pre_hook(quantize_feature)
    return predict_module


def _is_embedding(module: nn.Module, extra: tuple[type[nn.Module], ...]) -> bool:
    interfaces = (EmbeddingBagCollectionInterface, EmbeddingCollectionInterface)
    return isinstance(module, interfaces) or type(module) in extra


def _half_except_embeddings(module: nn.Module, extra: tuple[type[nn.Module], ...]) -> None:
    """``module.half()``, leaving the tables of embedding collections inside it (a DLRM's sparse
    arch) as stored: TorchRec's quantized tables are bytes that ``half()`` does not touch, and
    shardkit's float-stored tables must not change either."""
    if _is_embedding(module, extra):
        return
    module._apply(lambda t: t.half() if t.is_floating_point() else t, recurse=False)
    for child in module.children():
        _half_except_embeddings(child, extra)
