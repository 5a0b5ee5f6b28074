"""Preparing trained models for serving (TorchRec's ``torchrec.inference``)."""

from shardkit.inference.modules import quantize_embeddings

__all__ = ["quantize_embeddings"]
