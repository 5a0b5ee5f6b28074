"""Reading tests/compat/torchrec_names.txt and checking each name against shardkit.

    .venv/bin/python -m tests.compat.names      # the coverage table, per module

The list's format is described in its header (written by `list_torchrec_names.py`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

from shardkit.compat import NotInShardkitError

LIST = Path(__file__).with_name("torchrec_names.txt")
MARKS = ("refused", "pending")


@dataclass
class Entry:
    """One listed name and its mark (``""`` when shardkit has it)."""

    module: str  # the TorchRec (or FBGEMM) module
    name: str
    mark: str = ""  # "refused" | "pending" | ""
    reason: str = ""


@dataclass
class ModuleReport:
    """What shardkit does with one module's names."""

    module: str
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # unmarked, yet not importable
    refused: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.present) + len(self.missing) + len(self.refused) + len(self.pending)


def shardkit_path(module: str) -> str:
    """``torchrec.X`` -> ``shardkit.X``; ``fbgemm_gpu.X`` -> ``shardkit.fbgemm_gpu.X``."""
    head, _, rest = module.partition(".")
    if head == "torchrec":
        return "shardkit" + (f".{rest}" if rest else "")
    if head == "fbgemm_gpu":
        return f"shardkit.{module}"
    raise ValueError(f"{module}: expected a torchrec or fbgemm_gpu module")


def read_list(path: Path = LIST) -> dict[str, list[Entry]]:
    """``{module: entries}`` in the file's order; a malformed line is a ValueError naming it."""
    modules: dict[str, list[Entry]] = {}
    current: str | None = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            modules[current] = []
            continue
        if current is None:
            raise ValueError(f"{path.name}:{number}: a name before any [module] line")
        name, _, mark = (part.strip() for part in line.partition("|"))
        entry = Entry(current, name)
        if mark:
            kind, _, reason = (part.strip() for part in mark.partition(":"))
            if kind not in MARKS or not reason:
                raise ValueError(
                    f"{path.name}:{number}: mark {mark!r}; write 'refused: <why; what instead>' "
                    "or 'pending: <which work>'"
                )
            entry.mark, entry.reason = kind, reason
        modules[current].append(entry)
    return modules


def check_module(module: str, entries: list[Entry]) -> ModuleReport:
    """Import every name of ``entries`` from ``module``'s shardkit path; see the list's header."""
    report = ModuleReport(module)
    target = shardkit_path(module)
    try:
        shardkit_module = importlib.import_module(target)
    except ImportError as error:
        shardkit_module = None
        missing_module = f"{target} does not import ({error})"
    for entry in entries:
        if entry.mark == "pending":
            report.pending.append(entry.name)
            if shardkit_module is not None and _imports(target, entry.name) is None:
                report.problems.append(f"{entry.name} is there now: drop its pending mark")
            continue
        if shardkit_module is None:
            (report.refused if entry.mark else report.missing).append(entry.name)
            report.problems.append(f"{entry.name}: {missing_module}")
            continue
        error = _imports(target, entry.name)
        if entry.mark == "refused":
            report.refused.append(entry.name)
            if not isinstance(error, NotInShardkitError):
                report.problems.append(
                    f"{entry.name} should raise NotInShardkitError, got {error!r}"
                )
            elif entry.reason not in str(error):
                report.problems.append(
                    f"{entry.name}: the error {str(error)!r} does not give the listed reason "
                    f"{entry.reason!r}"
                )
        elif error is None:
            report.present.append(entry.name)
        else:
            report.missing.append(entry.name)
            report.problems.append(f"{entry.name}: {type(error).__name__}: {error}")
    return report


def _imports(module: str, name: str) -> Exception | None:
    """``from module import name`` as user code writes it; the error, or None."""
    try:
        exec(f"from {module} import {name}", {})
    except Exception as error:
        return error
    return None


def table(reports: list[ModuleReport]) -> str:
    """The coverage table, one row per module and a total (markdown)."""
    rows = [
        "| TorchRec module | names | present | refused | pending | missing |",
        "|---|---|---|---|---|---|",
    ]
    for r in [*reports, _total(reports)]:
        share = f" ({100 * len(r.present) / r.total:.0f}%)" if r.total else ""
        rows.append(
            f"| {r.module} | {r.total} | {len(r.present)}{share} | {len(r.refused)} | "
            f"{len(r.pending)} | {len(r.missing)} |"
        )
    return "\n".join(rows)


def _total(reports: list[ModuleReport]) -> ModuleReport:
    total = ModuleReport("**all**")
    for r in reports:
        total.present += r.present
        total.missing += r.missing
        total.refused += r.refused
        total.pending += r.pending
    return total


if __name__ == "__main__":
    print(table([check_module(m, e) for m, e in read_list().items()]))
