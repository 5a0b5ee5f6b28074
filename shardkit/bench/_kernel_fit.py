"""Fitting the embedding kernel's calibrated points: the `KernelFit` per optimizer (forward
over bags and missed ids, backward over touched and missed rows), the miss curve between the
tables inside and far outside the cache, and the effective cache size whose fits miss the
points least (see [Note: calibrated kernel model] in the planner). `shardkit bench calibrate`
times the points (`shardkit.bench._calibrate`); this module only fits and describes them."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from shardkit.bench._fit import fit_nonnegative
from shardkit.planner import KernelFit, miss_fraction

_MIB = 1 << 20


def fit_kernel(optimizer: str, points: Sequence[dict], cache: int) -> KernelFit:
    """The `KernelFit` of ``points`` with a cache of ``cache`` bytes (see
    [Note: calibrated kernel model]): forward over bags and the ids that miss, backward over
    the touched rows, those that miss and the bags' gradients, from the points inside and far
    outside the cache; then the miss curve from the points marked ``"curve"`` (`miss_curve`)."""
    base = [p for p in points if not p.get("curve")]
    miss = [miss_fraction(p["touched"], cache) for p in base]
    fits = []
    for written, missed, key in (
        ("bags", "ids", "forward_ms"),
        ("unique", "unique", "backward_ms"),
    ):
        rows = [
            [1.0, p["ids"], p["ids"] * p["dim"], p[written] * p["dim"], m * p[missed],
             m * p[missed] * p["dim"]]
            for p, m in zip(base, miss)
        ]  # fmt: skip
        if key == "backward_ms":  # the output gradient's rows
            rows = [[*row, p["bags"] * p["dim"]] for row, p in zip(rows, base)]
        fits.append(tuple(fit_nonnegative(rows, [p[key] for p in base], outliers=True)))
    fit = KernelFit(optimizer, fits[0], fits[1])
    return replace(fit, miss_curve=miss_curve(fit, [p for p in points if p.get("curve")], cache))


def miss_curve(
    fit: KernelFit, points: Sequence[dict], cache: int
) -> tuple[tuple[float, float, float], ...]:
    """Per working set of ``points`` (one each, the same dim), the miss weight ``m`` that makes
    ``fit`` give what each direction measured there: what the point took beyond ``fit``'s
    terms without misses, over its miss terms at ``m = 1``; `miss_fraction` where ``fit`` has
    no miss terms. Sizes measured twice keep the first. See [Note: calibrated kernel model]."""
    curve: dict[float, tuple[float, float, float]] = {}
    for p in sorted(points, key=lambda p: p["touched"]):
        ids, bags, dim, unique = p["ids"], p["bags"], p["dim"], p["unique"]
        plain = miss_fraction(p["touched"], cache)
        weights = []
        for measured, without, per_miss in (
            (p["forward_ms"], fit.forward_ms(ids, bags, dim),
             fit.forward_ms(ids, bags, dim, miss=1.0, calls=0) - fit.forward_ms(ids, bags, dim, calls=0)),
            (p["backward_ms"], fit.backward_ms(ids, unique, dim, bags=bags),
             fit.backward_ms(ids, unique, dim, miss=1.0, calls=0, bags=bags)
             - fit.backward_ms(ids, unique, dim, calls=0, bags=bags)),
        ):  # fmt: skip
            m = (measured - without) / per_miss if per_miss > 0 else plain
            weights.append(min(max(m, 0.0), _MAX_MISS))
        curve.setdefault(float(p["touched"]), (float(p["touched"]), weights[0], weights[1]))
    return tuple(curve.values())


# A miss weight beyond this is noise (another process's time slice), not the cache
_MAX_MISS = 4.0


def fit_kernels(points: dict[str, list[dict]], nominal_cache: int) -> tuple[int, list[KernelFit]]:
    """(effective cache bytes, a fit per optimizer): the cache size among ``nominal_cache /
    2**k`` (k = 0..4) whose fits miss the points least on average. A rank seldom has the whole last-level
    cache: a VM's cores share it with other tenants' and other ranks' cores."""
    best: tuple[float, int, list[KernelFit]] | None = None
    for k in range(5):
        cache = nominal_cache >> k
        fits = [fit_kernel(name, measured, cache) for name, measured in points.items()]
        error = sum(
            statistics.mean(_misses(fit, measured, cache))
            for fit, measured in zip(fits, points.values())
        )
        if best is None or error < best[0]:
            best = (error, cache, fits)
    assert best is not None
    return best[1], best[2]


def _misses(fit: KernelFit, points: Sequence[dict], cache: int) -> list[float]:
    """|predicted / measured - 1| of forward + backward at each point."""
    errors = []
    for p in points:
        m_fwd, m_bwd = (float(m) for m in fit.miss(p["touched"], cache))
        predicted = fit.forward_ms(p["ids"], p["bags"], p["dim"], miss=m_fwd) + fit.backward_ms(
            p["ids"], p["unique"], p["dim"], miss=m_bwd, bags=p["bags"]
        )
        errors.append(abs(predicted / (p["forward_ms"] + p["backward_ms"]) - 1))
    return sorted(errors)


def kernel_line(fit: KernelFit, points: Sequence[dict], cache: int) -> str:
    errors = _misses(fit, points, cache)
    big = max(points, key=lambda p: (p["ids"] * p["dim"], p["rows"]))
    curve = ", ".join(
        f"{size / _MIB:.0f} MiB {forward:.2f}/{backward:.2f}"
        for size, forward, backward in fit.miss_curve
    )
    return (
        f"{big['ids']} ids x dim {big['dim']}, {big['rows']} rows: forward "
        f"{big['forward_ms']:.2f} ms, backward+update {big['backward_ms']:.2f} ms; the fit "
        f"misses its {len(points)} points by {100 * errors[len(errors) // 2]:.0f}% (median), "
        f"{100 * errors[-1]:.0f}% (worst)"
        + (f"; miss weight (forward/backward) at {curve}" if curve else "")
    )
