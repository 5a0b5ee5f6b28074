"""The collections on the compiled kernel against the same collections on the eager one: outputs,
tables and the fused optimizer's whole state after several steps."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)
from shardkit.kernels import use_kernel
from shardkit.optim import EmbOptimType

LIMITS = {"a": 9, "b": 9, "c": 13, "d": 6}
STEPS = 3


def _bag_configs() -> list[EmbeddingBagConfig]:
    """Two dim-4 tables (one MEAN, one with two features) stacked together, and a dim-6 one."""
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=9, feature_names=["a", "b"]),
        EmbeddingBagConfig(
            name="t1", embedding_dim=4, num_embeddings=13, feature_names=["c"],
            pooling=PoolingType.MEAN,
        ),
        EmbeddingBagConfig(name="t2", embedding_dim=6, num_embeddings=6, feature_names=["d"]),
    ]  # fmt: skip


def _kjt(step: int, batch_size: int, weighted: bool) -> KeyedJaggedTensor:
    """int32 ids, bags of 0-3 with duplicates; feature 'd' is empty in even steps."""
    g = torch.Generator().manual_seed(step)
    lengths, values = [], []
    for key, limit in LIMITS.items():
        key_lengths = torch.randint(0, 4, (batch_size,), generator=g)
        if key == "d" and step % 2 == 0:
            key_lengths.zero_()
        lengths.append(key_lengths)
        values.append(torch.randint(0, limit, (int(key_lengths.sum()),), generator=g))
    values = torch.cat(values).int()
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(
        keys=list(LIMITS), values=values, lengths=torch.cat(lengths), weights=weights
    )


def _run(module, path: str, kjt: KeyedJaggedTensor, scale: torch.Tensor) -> torch.Tensor:
    with use_kernel(path):
        out = module(kjt)
    values = out.values() if hasattr(out, "values") and callable(out.values) else out
    (values * scale).sum().backward()
    return values.detach()


# The rules with a compiled kernel (the others run eager only: tests/kernels/test_parity.py).
COMPILED_RULES = [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD,
                  EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.ADAM]  # fmt: skip


@pytest.mark.parametrize("optimizer", COMPILED_RULES, ids=lambda k: k.value)
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_collection_matches_eager(optimizer, weighted):
    torch.manual_seed(0)
    fused = {"optimizer": optimizer, "learning_rate": 0.1, "weight_decay": 0.01}
    compiled = EmbeddingBagCollection(
        tables=_bag_configs(), is_weighted=weighted, fused_params=fused
    )
    eager = copy.deepcopy(compiled)
    for step in range(STEPS):
        kjt = _kjt(step, 3, weighted)
        scale = torch.rand(3, 4 * 3 + 6, generator=torch.Generator().manual_seed(100 + step))
        actual = _run(compiled, "compiled", kjt, scale)
        expected = _run(eager, "eager", kjt, scale)
        torch.testing.assert_close(actual, expected, msg=f"step {step}")
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict())
    _assert_same_optimizer_state(compiled, eager)


def test_embedding_collection_matches_eager():
    torch.manual_seed(1)
    configs = [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=9, feature_names=["a", "b"]),
        EmbeddingConfig(name="t1", embedding_dim=4, num_embeddings=13, feature_names=["c"]),
        EmbeddingConfig(name="t2", embedding_dim=4, num_embeddings=6, feature_names=["d"]),
    ]
    fused = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1}
    compiled = EmbeddingCollection(tables=configs, fused_params=fused)
    eager = copy.deepcopy(compiled)
    for step in range(STEPS):
        kjt = _kjt(step, 2, weighted=False)
        results = []
        for module, path in ((compiled, "compiled"), (eager, "eager")):
            with use_kernel(path):
                out = module(kjt)
            values = torch.cat([out[key].values() for key in LIMITS])
            scale = torch.rand(values.shape, generator=torch.Generator().manual_seed(step))
            (values * scale).sum().backward()
            results.append(values.detach())
        torch.testing.assert_close(results[0], results[1], msg=f"step {step}")
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict())
    _assert_same_optimizer_state(compiled, eager)


def test_dense_gradients_without_a_fused_optimizer_match_eager():
    torch.manual_seed(2)
    compiled = EmbeddingBagCollection(tables=_bag_configs(), is_weighted=True)
    eager = copy.deepcopy(compiled)
    kjt = _kjt(1, 3, weighted=True)
    scale = torch.rand(3, 18, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        _run(compiled, "compiled", kjt, scale), _run(eager, "eager", kjt, scale)
    )
    for (name, param), ref in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(param.grad, ref.grad, msg=name)


def _assert_same_optimizer_state(actual, expected) -> None:
    actual.fused_optimizer.save_param_groups(True)
    expected.fused_optimizer.save_param_groups(True)
    mine, theirs = actual.fused_optimizer.state_dict(), expected.fused_optimizer.state_dict()
    torch.testing.assert_close(mine["state"], theirs["state"])  # step counters included
    assert mine["param_groups"] == theirs["param_groups"]
