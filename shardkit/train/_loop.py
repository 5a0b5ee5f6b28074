"""One rank of ``shardkit train``: plan, shard, train with the pipeline, validate, checkpoint.

[Note: resuming bit-identically]
A checkpoint is written at the end of every epoch with the tables (and their fused optimizer
state), the dense parameters and optimizer, the data iterator's position and every rank's RNG
state. Resuming loads all of it, so the run continues as if it had never stopped: training 2
epochs straight and 1 epoch + resume + 1 epoch give the same losses and weights (same world
size and plan; a different world size or plan loads the same model and optimizer state, resharded,
and the data position when the global batch size is unchanged).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from shardkit import checkpoint, comm
from shardkit.metrics import BinaryMetrics, JsonlWriter, ThroughputMeter
from shardkit.sharding import DistributedModelParallel, TrainPipelineSparseDist
from shardkit.train._build import (
    build_data,
    build_model,
    dense_optimizer,
    dense_wrapper,
    planner_for,
    sharders_for,
)
from shardkit.train._config import TrainConfig
from shardkit.train._prepare import Prepared, prepare_on_ranks
from shardkit.train._progress import Progress

__all__ = ["train_rank"]

logger = logging.getLogger(__name__)


def train_rank(
    rank: int,
    world_size: int,
    config: TrainConfig,
    prepared: Prepared | None = None,
    *,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Train on this rank; returns the last validation metrics (and plan text) on every rank.

    ``prepared`` is what `prepare` found before the ranks started (`run` passes it); without
    it, rank 0 prepares now and tells the others (see [Note: refusing input before ranks
    start]). ``device``: where the model trains (default: the process group's, see
    `DistributedModelParallel`).
    """
    torch.manual_seed(config.seed)
    say = logger.info if rank == 0 else (lambda *a, **k: None)  # the CLI shows shardkit.train
    if prepared is None:
        prepared = prepare_on_ranks(config, rank, world_size)
    if prepared.table is not None:
        say(prepared.table.summary())
    data = build_data(config, rank, world_size, prepared.table)
    model = build_model(config, data)
    sharders = sharders_for(config)
    planner = planner_for(config, model, world_size)
    plan = planner.collective_plan(model, sharders)
    say(f"sharding plan: {plan}")  # the stats table: per-rank memory and cost, each table
    if config.plan_only:
        return {"plan": str(plan)}
    dmp = DistributedModelParallel(
        model,
        plan=plan,
        sharders=sharders,
        device=device,
        data_parallel_wrapper=dense_wrapper(config),
    )
    optimizer = dense_optimizer(config, dmp)
    start_epoch, step = _maybe_resume(config, prepared.resume_from, dmp, optimizer, data, say)
    history = []
    metrics = JsonlWriter(config.metrics_file) if rank == 0 else None
    for epoch in range(start_epoch, config.epochs):
        step, results = _train_epoch(config, dmp, optimizer, data, epoch, step, rank, metrics)
        results = {**_validate(dmp, data), **results}
        history.append(results)
        say(_epoch_line(results))
        if metrics is not None:
            metrics.write({"kind": "validation", **results})
        extra = {"epoch": epoch + 1, "step": step, "data": data.train.state_dict()}
        if data.fitted is not None:  # export, evaluation and serving map raw values with it
            extra["schema"] = data.fitted.to_dict()
        path = checkpoint.save(config.checkpoint_dir, step=step, model=dmp, optimizer=optimizer,
                               extra=extra, keep=config.keep_checkpoints)  # fmt: skip
        say(f"checkpoint: {path}")
    if metrics is not None:
        metrics.close()
        plot = config.checkpoint_dir if config.metrics_path is None else config.metrics_path
        say(f"metrics: {config.metrics_file}; draw them with: shardkit plot {plot}")
    return {"history": history, "plan": str(plan)}


def _epoch_line(results: dict[str, Any]) -> str:
    return (
        f"epoch {results['epoch']}: validation AUC {results['auc']:.4f}, log loss "
        f"{results['log_loss']:.4f}, normalized entropy {results['normalized_entropy']:.4f}, "
        f"accuracy {results['accuracy']:.4f} ({results['num_examples']:.0f} examples); "
        f"train {results['epoch_samples_per_s']:,.0f} samples/s over the epoch "
        f"({results['samples_per_s']:,.0f} after warm-up); waiting for data "
        f"{results['data_time_share']:.1%} of the epoch's time (reading where training waited: "
        f"{results['data_samples_per_s']:,.0f} samples/s)"
    )


def _maybe_resume(config, found, dmp, optimizer, data, say) -> tuple[int, int]:
    if found is None:
        if config.resume:
            say(f"--resume: no checkpoint in {config.checkpoint_dir} yet, starting afresh")
        return 0, 0
    step = int(found.name.rsplit("-", 1)[-1])  # an imported checkpoint's own number
    extra = checkpoint.load(
        found, model=dmp, optimizer=optimizer, extra={"epoch": 0, "step": step, "data": {}}
    )
    if extra["data"]:  # an imported checkpoint has no data position: start at the beginning
        data.train.load_state_dict(extra["data"])
    say(f"resumed from {found}: epoch {extra['epoch']}, step {extra['step']}")
    return extra["epoch"], extra["step"]


def _train_epoch(
    config, dmp, optimizer, data, epoch, step, rank, metrics
) -> tuple[int, dict[str, float]]:
    pipeline = TrainPipelineSparseDist(dmp, optimizer, dmp.device)  # batches go to its device
    total = len(data.train) if hasattr(data.train, "__len__") else None  # streams: unknown
    if config.max_steps_per_epoch is not None:
        total = min(total or config.max_steps_per_epoch, config.max_steps_per_epoch)
    reading = _Timed(data.train)
    source = iter(reading)
    batches = source
    if dmp.device.type == "cuda":  # the pipeline's copy stream overlaps only pinned copies
        batches = (batch.pin_memory() for batch in source)
    progress = Progress(total, epoch, enabled=config.progress and rank == 0)
    meter = ThroughputMeter(warmup_steps=2 if total is None else min(2, max(total - 1, 0)))
    global_batch = config.batch_size * torch.distributed.get_world_size()
    start, losses = time.perf_counter(), []
    done = 0
    while total is None or done < total:
        done += 1
        try:
            loss, _, _ = pipeline.progress(batches)
        except StopIteration:
            break
        step += 1
        losses.append(loss.item())
        meter.step(config.batch_size)
        speed = done * global_batch / (time.perf_counter() - start)
        progress.update(step, losses[-1], speed)
        if step % config.log_every == 0:  # every rank: the loss is averaged over them
            recent = losses[-min(config.log_every, len(losses)) :]
            mean = _mean_over_ranks(sum(recent) / len(recent), dmp.device)
            if metrics is not None:
                metrics.write(
                    {"kind": "train", "epoch": epoch, "step": step, "loss": float(mean),
                     "samples_per_s": speed}
                )  # fmt: skip
    progress.close()
    data_rate, data_share, epoch_seconds = reading.rates(time.perf_counter() - start, dmp.device)
    if config.max_steps_per_epoch is not None:
        for _ in source:  # skip the rest of a shortened epoch so the next one starts cleanly
            pass
    # the epoch's mean loss over all ranks' examples (each rank's batch is the same size)
    mean = _mean_over_ranks(sum(losses) / max(len(losses), 1), dmp.device)
    return step, {
        "epoch": epoch,
        "step": step,
        "train_loss": mean,
        "samples_per_s": meter.compute().get("samples_per_s", float("nan")),
        # over the whole epoch, as reading's rate and share are (the shuffle buffer fills and
        # the pipeline starts in the warm-up steps that samples_per_s leaves out)
        "epoch_samples_per_s": len(losses) * global_batch / max(epoch_seconds, 1e-9),
        "data_samples_per_s": data_rate,
        "data_time_share": data_share,
    }


class _Timed:
    """The data iterator, timed: how long this rank waits for each batch. A reader that makes
    batches in the training thread (Adult, Criteo) is timed whole: its rate is reading alone; a
    prefetching reader (tables) is timed only where training waits for it."""

    def __init__(self, batches: Any) -> None:
        self.batches, self.seconds, self.samples = batches, 0.0, 0

    def __iter__(self) -> Any:
        batches = iter(self.batches)
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            self.seconds += time.perf_counter() - start
            if batch is None:
                return
            self.samples += batch.batch_size
            yield batch

    def rates(self, epoch_seconds: float, device: torch.device) -> tuple[float, float, float]:
        """(samples/s all ranks together would read at the slowest rank's rate, the largest
        share of a rank's epoch spent reading, the longest rank's epoch seconds); a
        collective, through ``device`` (NCCL carries no CPU tensor)."""
        rate = self.samples / self.seconds if self.seconds > 0 else float("inf")
        share = self.seconds / max(epoch_seconds, 1e-9)
        mine = torch.tensor([-rate, share, epoch_seconds], dtype=torch.float64, device=device)
        worst = comm.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
        assert isinstance(worst, torch.Tensor)
        worst = worst.cpu()
        world_size = torch.distributed.get_world_size()
        return -float(worst[0]) * world_size, float(worst[1]), float(worst[2])


def _mean_over_ranks(value: float, device: torch.device) -> float:
    """``value`` averaged over the ranks, through the DMP's device (NCCL carries no CPU tensor)."""
    local = torch.tensor([value], dtype=torch.float64, device=device)
    mean = comm.all_reduce(local, op=torch.distributed.ReduceOp.AVG)
    assert isinstance(mean, torch.Tensor)
    return float(mean.item())


@torch.no_grad()
def _validate(dmp, data) -> dict[str, float]:
    dmp.eval()
    metrics = BinaryMetrics()
    for batch in data.validation:
        _, (_, logits, labels) = dmp(batch.to(dmp.device))
        metrics.update(logits, labels, batch.weights)
    dmp.train()
    return {k: float(v) for k, v in metrics.compute().items()}
