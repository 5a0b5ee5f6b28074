"""TorchRec's RecMetricModule family (AUC, NE and log loss, calibration, CTR, accuracy, MSE):
the formulas, the window, the keys, the values over several ranks equal to one process's over all
examples, and (optional tier) the same values as TorchRec's own module on the same updates."""

from __future__ import annotations

import math

import pytest
import torch

from shardkit.metrics.metric_module import RecMetricModule, generate_metric_module
from shardkit.metrics.metrics_config import (
    DefaultTaskInfo,
    MetricsConfig,
    RecComputeMode,
    RecMetricDef,
    RecMetricEnum,
    RecTaskInfo,
)
from shardkit.metrics.ne import NEMetric
from tests.compat.peers import run_in_torchrec

B = 8
TASKS = [RecTaskInfo(name="click", label_name="click_label", prediction_name="click_pred",
                     weight_name="click_w"),
         RecTaskInfo(name="buy", label_name="buy_label", prediction_name="buy_pred",
                     weight_name="buy_w")]  # fmt: skip
SIX = ["NE", "AUC", "CTR", "CALIBRATION", "MSE", "ACCURACY"]


def _config(window: int, mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION,
            arguments: dict | None = None, **extra) -> MetricsConfig:  # fmt: skip
    return MetricsConfig(
        rec_tasks=TASKS,
        rec_metrics={RecMetricEnum[name]: RecMetricDef(rec_task_indices=[0, 1], window_size=window,
                                                       arguments=(arguments or {}).get(name))
                     for name in SIX},
        rec_compute_mode=mode, **extra,
    )  # fmt: skip


def _outputs(steps: int, seed: int = 0, batch: int = B) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    result = []
    for _ in range(steps):
        out = {}
        for task in TASKS:
            p = torch.rand(batch, generator=g)
            out[task.prediction_name] = p
            out[task.label_name] = (torch.rand(batch, generator=g) < p).float()
            out[task.weight_name] = torch.rand(batch, generator=g) + 0.5
        result.append(out)
    return result


def _module(config: MetricsConfig, world_size: int = 1, rank: int = 0, batch: int = B):
    return generate_metric_module(RecMetricModule, config, batch_size=batch, world_size=world_size,
                                  my_rank=rank, state_metrics_mapping={},
                                  device=torch.device("cpu"))  # fmt: skip


def _expected(outputs: list[dict[str, torch.Tensor]], task: RecTaskInfo) -> dict[str, float]:
    """The six metrics from their definitions, over every example of ``outputs``."""
    p = torch.cat([o[task.prediction_name] for o in outputs]).double()
    y = torch.cat([o[task.label_name] for o in outputs]).double()
    w = torch.cat([o[task.weight_name] for o in outputs]).double()
    ce = -(w * (y * torch.log2(p) + (1 - y) * torch.log2(1 - p))).sum()
    base = (w * y).sum() / w.sum()
    entropy = -(w * (y * math.log2(base) + (1 - y) * math.log2(1 - base))).sum()
    pos = [(pi, wi) for pi, yi, wi in zip(p, y, w) if yi == 1]
    neg = [(pi, wi) for pi, yi, wi in zip(p, y, w) if yi == 0]
    auc = sum(wp * wn * (1.0 if sp > sn else 0.5 if sp == sn else 0.0)
              for sp, wp in pos for sn, wn in neg) / (sum(x for _, x in pos) * sum(x for _, x in neg))  # fmt: skip
    return {
        "ne": float(ce / entropy),
        "auc": float(auc),
        "ctr": float(base),
        "calibration": float((w * p).sum() / (w * y).sum()),
        "mse": float((w * (y - p) ** 2).sum() / w.sum()),
        "accuracy": float((w * ((p >= 0.5).double() == y)).sum() / w.sum()),
    }


@pytest.mark.parametrize("mode", [RecComputeMode.UNFUSED_TASKS_COMPUTATION,
                                  RecComputeMode.FUSED_TASKS_COMPUTATION])  # fmt: skip
def test_values_follow_the_definitions(mode):
    outputs = _outputs(3)
    metrics = _module(_config(window=1000, mode=mode))
    for out in outputs:
        metrics.update(out)
    values = metrics.compute()
    for task in TASKS:
        expected = _expected(outputs, task)
        for name, value in expected.items():
            prefix = "window" if name == "auc" else "lifetime"
            got = values[f"{name}-{task.name}|{prefix}_{name}"]
            assert float(got) == pytest.approx(value, rel=1e-6), (
                f"{task.name} {name}"
            )  # float32 sums


def test_the_window_keeps_the_latest_examples():
    outputs = _outputs(5)
    metrics = _module(_config(window=2 * B))
    for out in outputs:
        metrics.update(out)
    values = metrics.compute()
    recent = _expected(outputs[-2:], TASKS[0])
    lifetime = _expected(outputs, TASKS[0])
    for name in ("ne", "ctr", "calibration", "mse", "accuracy"):
        assert float(values[f"{name}-click|window_{name}"]) == pytest.approx(recent[name])
        assert float(values[f"{name}-click|lifetime_{name}"]) == pytest.approx(lifetime[name])
    assert float(values["auc-click|window_auc"]) == pytest.approx(recent["auc"])


def _ranks_compute(rank: int, world_size: int, steps: int):
    metrics = _module(_config(window=10_000), world_size=world_size, rank=rank)
    for out in _outputs(steps, seed=10 + rank, batch=B + rank):  # uneven batches per rank
        metrics.update(out)
    return {k: float(v) for k, v in metrics.compute().items() if "throughput" not in k}


@pytest.mark.parametrize("world_size", [2, 3])
def test_values_over_ranks_are_one_process_over_every_example(run_ranks, world_size):
    results = run_ranks(_ranks_compute, world_size, 2)
    every = [o for r in range(world_size) for o in _outputs(2, seed=10 + r, batch=B + r)]
    for task in TASKS:
        for name, value in _expected(every, task).items():
            prefix = "window" if name == "auc" else "lifetime"
            assert results[0][f"{name}-{task.name}|{prefix}_{name}"] == pytest.approx(value)
    assert all(result == {} for result in results[1:])  # only rank 0 reports


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"RecMetricEnum.AUPRC is not in shardkit; it has "
                       r"\['ACCURACY', 'AUC', 'CALIBRATION', 'CTR', 'MSE', 'NE'\]"):  # fmt: skip
        _module(MetricsConfig(rec_tasks=TASKS, rec_metrics={
            RecMetricEnum.AUPRC: RecMetricDef(rec_task_indices=[0])}))  # fmt: skip
    metrics = _module(_config(window=100))
    with pytest.raises(ValueError, match=r"task 'click' reads 'click_w', which the model output "
                       r"does not have"):  # fmt: skip
        metrics.update({"click_label": torch.ones(2), "click_pred": torch.ones(2)})
    with pytest.raises(ValueError, match=r"the window per rank \(ceil\(10 / 2\) = 5\) must be at "
                       r"least the batch size 8"):  # fmt: skip
        NEMetric(world_size=2, my_rank=0, batch_size=8, tasks=[DefaultTaskInfo], window_size=10)
    with pytest.raises(TypeError, match=r"NEMetricComputation got unknown argument\(s\) "
                       r"\['include_los'\]"):  # fmt: skip
        NEMetric(world_size=1, my_rank=0, batch_size=8, tasks=[DefaultTaskInfo],
                 include_los=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"rec_task_indices 5, but there are 2 rec_tasks"):
        MetricsConfig(
            rec_tasks=TASKS, rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_task_indices=[5])}
        )


_TORCHREC = """
from torchrec.metrics.metric_module import RecMetricModule, generate_metric_module
from torchrec.metrics.metrics_config import (MetricsConfig, RecComputeMode, RecMetricDef,
                                             RecMetricEnum, RecTaskInfo)
tasks = [RecTaskInfo(name=n, label_name=f"{n}_label", prediction_name=f"{n}_pred", weight_name=f"{n}_w")
         for n in ("click", "buy")]
for label, mode, window in inputs["cases"]:
    config = MetricsConfig(rec_tasks=tasks, rec_compute_mode=RecComputeMode[mode], rec_metrics={
        RecMetricEnum[n]: RecMetricDef(rec_task_indices=[0, 1], window_size=window,
                                       arguments={"include_logloss": True} if n == "NE" else
                                       {"include_r_squared": True} if n == "MSE" else None)
        for n in ("NE", "AUC", "CTR", "CALIBRATION", "MSE", "ACCURACY")})
    module = generate_metric_module(RecMetricModule, config, batch_size=8, world_size=1, my_rank=0,
                                    state_metrics_mapping={}, device=torch.device("cpu"))
    for out in inputs["outputs"]:
        module.update(out)
    outputs[label] = ({k: v for k, v in module.compute().items()}, sorted(module.state_dict()))
"""


@pytest.fixture(scope="module")
def torchrec_values(tmp_path_factory):
    outputs = _outputs(5)
    cases = [("unfused", "UNFUSED_TASKS_COMPUTATION", 10_000),
             ("fused", "FUSED_TASKS_COMPUTATION", 10_000),
             ("window", "UNFUSED_TASKS_COMPUTATION", 24)]  # fmt: skip
    sent = {"outputs": outputs, "cases": cases}
    return outputs, cases, run_in_torchrec(_TORCHREC, sent, tmp_path_factory.mktemp("peer"))


@pytest.mark.parametrize("case", ["unfused", "fused", "window"])
def test_same_values_and_state_keys_as_torchrec(torchrec_values, case):
    outputs, cases, theirs = torchrec_values
    _, mode, window = next(c for c in cases if c[0] == case)
    arguments = {"NE": {"include_logloss": True}, "MSE": {"include_r_squared": True}}
    metrics = _module(_config(window, RecComputeMode[mode], arguments))
    for out in outputs:
        metrics.update(out)
    ours = metrics.compute()
    values, state_keys = theirs[case]
    assert sorted(ours) == sorted(values)
    for key, value in values.items():
        torch.testing.assert_close(ours[key].double().reshape(value.shape), value.double(),
                                   rtol=1e-6, atol=1e-9, msg=key)  # fmt: skip
    assert sorted(metrics.state_dict()) == state_keys


def test_throughput_state_metrics_and_compute_interval():
    from shardkit.metrics.metric_module import StateMetric
    from shardkit.metrics.metrics_config import StateMetricEnum, ThroughputDef

    class Rates(StateMetric):
        def get_metrics(self):
            return {"lr": 0.5}

    config = MetricsConfig(rec_tasks=[DefaultTaskInfo], throughput_metric=ThroughputDef(warmup_steps=2),
                           state_metrics=[StateMetricEnum.OPTIMIZERS], compute_interval_steps=3)  # fmt: skip
    metrics = generate_metric_module(RecMetricModule, config, batch_size=4, world_size=2, my_rank=0,
                                     state_metrics_mapping={StateMetricEnum.OPTIMIZERS: Rates()},
                                     device=torch.device("cpu"))  # fmt: skip
    steps = []
    for _ in range(6):
        metrics.update({})
        steps.append(metrics.should_compute())
    assert steps == [False, False, True, False, False, True]
    values = metrics.compute()
    assert int(values["throughput-throughput|total_examples"]) == 6 * 4 * 2
    assert float(values["throughput-throughput|lifetime_throughput"]) > 0
    assert values["optimizers-optimizers|lr"] == 0.5
