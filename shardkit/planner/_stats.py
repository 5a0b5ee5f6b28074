"""`PlanStats`: what a plan costs, per rank and per table, as data and as a printable table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shardkit.planner._errors import format_bytes

__all__ = ["PlanStats", "RankStats", "TableStats", "format_ranks"]


@dataclass(frozen=True)
class RankStats:
    """One rank: bytes of table shards, ms of lookups and communication, number of shards."""

    rank: int
    host: int
    memory: int
    compute: float
    comms: float
    num_shards: int

    @property
    def cost(self) -> float:
        return self.compute + self.comms


@dataclass(frozen=True)
class TableStats:
    """One table: how it is sharded and what it costs in all (``shards``: (count, rows, cols))."""

    table: str
    num_embeddings: int
    embedding_dim: int
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    shards: tuple[tuple[int, int, int], ...]
    memory: int
    cost: float


@dataclass(frozen=True)
class PlanStats:
    """A plan's estimates. ``str(stats)`` is the table the planner logs.

    Memory is per rank in bytes: ``capacity`` of the compute device, of which ``margin``,
    ``dense`` (the dense model) and ``kjt`` (input batches) are reserved, leaving ``available``
    for table shards. Costs are estimated ms per training step (see docs/planner.md).
    """

    world_size: int
    local_world_size: int
    compute_device: str
    batch_size: int
    capacity: int
    margin: int
    dense: int
    kjt: int
    ranks: tuple[RankStats, ...]
    tables: tuple[TableStats, ...]
    num_proposals: int = 0

    @property
    def available(self) -> int:
        return self.capacity - self.margin - self.dense - self.kjt

    @property
    def cost_imbalance(self) -> float:
        """max / mean of per-rank cost (1.0 is perfect balance)."""
        return _imbalance([r.cost for r in self.ranks])

    @property
    def memory_imbalance(self) -> float:
        """max / mean of per-rank memory."""
        return _imbalance([r.memory for r in self.ranks])

    @property
    def max_cost(self) -> float:
        return max(r.cost for r in self.ranks)

    @property
    def max_memory(self) -> int:
        return max(r.memory for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            available=self.available,
            cost_imbalance=self.cost_imbalance,
            memory_imbalance=self.memory_imbalance,
        )
        return data

    def __str__(self) -> str:
        return "\n".join([*self._header(), "", *self._rank_rows(), "", *self._table_rows()])

    def _header(self) -> list[str]:
        hosts = self.world_size // self.local_world_size
        kind = "hbm" if self.compute_device == "cuda" else "ddr"
        return [
            f"sharding plan: {len(self.tables)} tables on {self.world_size} ranks ({hosts} "
            f"host(s) x {self.local_world_size}), {self.compute_device}, batch size "
            f"{self.batch_size} per rank",
            f"memory per rank: {format_bytes(self.capacity)} {kind}, of which "
            f"{format_bytes(self.margin)} margin, {format_bytes(self.dense)} dense model, "
            f"{format_bytes(self.kjt)} input batches; {format_bytes(self.available)} for tables",
            f"imbalance (max/mean): cost {self.cost_imbalance:.3f}, memory "
            f"{self.memory_imbalance:.3f}; max cost {self.max_cost:.4g} ms, max memory "
            f"{format_bytes(self.max_memory)}",
        ]

    def _rank_rows(self) -> list[str]:
        rows = [("rank", "host", "memory", "% avail", "cost ms", "compute", "comms", "shards")]
        for r in self.ranks:
            share = 100.0 * r.memory / self.available if self.available else 0.0
            rows.append(
                (
                    str(r.rank),
                    str(r.host),
                    format_bytes(r.memory),
                    f"{share:.1f}",
                    f"{r.cost:.4g}",
                    f"{r.compute:.4g}",
                    f"{r.comms:.4g}",
                    str(r.num_shards),
                )
            )
        return _align(rows, left=set())

    def _table_rows(self) -> list[str]:
        rows = [("table", "rows x dim", "type", "kernel", "ranks", "shards", "memory", "cost ms")]
        for t in self.tables:
            shards = ", ".join(f"{n} x [{r}, {c}]" for n, r, c in t.shards)
            rows.append(
                (
                    t.table,
                    f"{t.num_embeddings} x {t.embedding_dim}",
                    t.sharding_type,
                    t.compute_kernel,
                    format_ranks(t.ranks),
                    shards,
                    format_bytes(t.memory),
                    f"{t.cost:.4g}",
                )
            )
        return _align(rows, left={0, 1, 2, 3, 4, 5})


def format_ranks(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 3, 7] -> "0-3,7"."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _imbalance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def _align(rows: Sequence[tuple[str, ...]], left: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]
