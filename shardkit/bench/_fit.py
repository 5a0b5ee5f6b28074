"""The least-squares fit every calibrated cost uses: non-negative coefficients, relative error
(see `fit_nonnegative`); a point's samples combined by their median (`median_by`, `spread`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

__all__ = ["fit_nonnegative", "median_by", "spread"]


def fit_nonnegative(
    rows: Sequence[Sequence[float]], times: Sequence[float], *, outliers: bool = False
) -> list[float]:
    """Coefficients ``c >= 0`` minimising the relative error of ``rows @ c`` against ``times``.

    Least squares on rows scaled by ``1 / time`` (a 1 ms point counts as much as a 100 ms one),
    then, while a coefficient is negative, that feature is dropped (set to 0) and the rest
    refitted. Features that never vary are dropped the same way. With ``outliers``, points the
    first fit misses by more than 3 times the median miss (and 30%) are left out and the rest
    refitted once: on a shared machine one point can catch another process's time slice.
    """
    a = torch.tensor(rows, dtype=torch.float64)
    t = torch.tensor(times, dtype=torch.float64)
    if a.dim() != 2 or a.shape[0] != t.shape[0] or a.shape[0] == 0:
        raise ValueError(f"fit_nonnegative needs one time per row, got {a.shape} and {t.shape}")
    if not bool((t > 0).all()):
        raise ValueError(f"fit_nonnegative needs times > 0, got {t.tolist()}")
    coef = _nonnegative_lstsq(a, t)
    if outliers and a.shape[0] > a.shape[1] + 2:
        miss = ((a @ coef) / t - 1).abs()
        keep = miss <= torch.clamp(3 * miss.median(), min=0.3)
        if int((~keep).sum()) > 0 and int(keep.sum()) >= a.shape[1]:
            coef = _nonnegative_lstsq(a[keep], t[keep])
    return coef.tolist()


def _nonnegative_lstsq(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    weighted = a / t[:, None]
    scale = weighted.abs().amax(dim=0)  # columns to unit size: conditioning
    active = [j for j in range(a.shape[1]) if float(scale[j]) > 0]
    coef = torch.zeros(a.shape[1], dtype=torch.float64)
    while active:
        cols = weighted[:, active] / scale[active]
        solution = torch.linalg.lstsq(cols, torch.ones_like(t)[:, None]).solution[:, 0]
        solution = solution / scale[active]
        worst = int(torch.argmin(solution))
        if float(solution[worst]) >= 0:
            coef[active] = solution
            break
        del active[worst]
    return coef


def spread(values: Sequence[float]) -> tuple[float, float, int]:
    """(lowest, highest, how many) of one point's samples, for the profile's ``spread``."""
    return float(min(values)), float(max(values)), len(values)


def median_by(rows: Sequence[dict], keys: Sequence[str], value: str = "ms") -> list[dict]:
    """``rows`` with the samples of one point (rows equal in ``keys``) replaced by one row whose
    ``value`` is their median (the first row's other fields), in first-seen order. calibrate
    takes each noisy point as several samples spread over its run: one slow spell of the
    machine moves the median of a point's samples less than it moves any one of them."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    return [
        {**same[0], value: statistics.median(r[value] for r in same)} for same in groups.values()
    ]
