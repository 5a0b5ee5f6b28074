"""2 MiB pages for the compiled kernel's tables: advised on first use where the OS allows, again
for a table allocated where a freed one was, and not at all when switched off."""

from __future__ import annotations

import contextlib
import logging
import mmap
import re

import pytest
import torch

from shardkit.compat import _libc
from shardkit.kernels import (
    _pages,
    _select,
    advise_new_table,
    huge_page_bytes,
    set_huge_pages,
    use_kernel,
)
from shardkit.kernels import pooled_forward as compiled_forward
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig, stack_tables
from shardkit.optim import EmbOptimType, FusedOptimizerConfig

ADAM = EmbOptimType.ADAM

MIB = 1 << 20
THP = _pages.thp_mode()
needs_thp = pytest.mark.skipif(
    THP not in ("always", "madvise"), reason=f"transparent huge pages are {THP!r} here"
)


@pytest.fixture
def compiled():
    with use_kernel("compiled"):
        yield
    set_huge_pages(True)
    _pages._switched = None  # (the switch is the environment's again)


def _stats() -> list[int]:
    """[enabled, bytes advised, bytes collapsed, bytes refused], since the library loaded."""
    return list(torch.ops.shardkit.huge_page_stats())


def _first_lookup(memory: mmap.mmap | None = None) -> torch.Tensor:
    """An 8 MiB table (in ``memory`` if given), written before the kernel sees it (as a module's
    init does), looked up."""
    if memory is None:
        table = torch.empty(MIB // 32, 64)  # 8 MiB: 3-4 whole 2 MiB pages inside it
    else:
        table = torch.frombuffer(memory, dtype=torch.float32, count=MIB * 2).view(-1, 64)
    table.fill_(0.5)
    ids = torch.tensor([0, 5, MIB // 32 - 1])
    out = compiled_forward(table, ids, torch.tensor([0, 3]), None)
    torch.testing.assert_close(out, torch.full((1, 64), 1.5))
    return table


@needs_thp
def test_tables_are_advised_and_a_table_reusing_a_freed_address_is_advised_again(compiled):
    before = _stats()
    table = _first_lookup()
    after = _stats()
    assert after[0] == 1
    assert after[1] - before[1] >= 2 * MIB, "the table was not advised"
    if after[2] > before[2]:  # the collapse took (it may not where memory is fragmented)
        assert huge_page_bytes(table) >= 2 * MIB

    memory = mmap.mmap(-1, 8 * MIB)  # two tables, one after the other, at the same address
    first = _first_lookup(memory)
    advised = _stats()[1]
    address = first.data_ptr()
    del first  # (its storage dies; the memory stays, as a freed mapping glibc hands back)
    second = _first_lookup(memory)
    assert second.data_ptr() == address
    assert _stats()[1] - advised >= 2 * MIB, "a new table where a freed one was is not advised"


@needs_thp
def test_switched_off_nothing_is_advised(compiled):
    assert set_huge_pages(False) is True
    before = _stats()
    _first_lookup()  # (its memory may still be on huge pages a freed table left it: not asserted)
    assert _stats()[1:] == before[1:]


def test_env_var_turns_them_off_and_says_so(compiled, monkeypatch, caplog):
    monkeypatch.setenv(_pages.ENV_VAR, "0")
    with caplog.at_level(logging.INFO, logger="shardkit.kernels._pages"):
        _pages.apply_env()
    assert _stats()[0] == 0
    assert caplog.messages == [
        "2 MiB pages for compiled tables and optimizer state: off (SHARDKIT_HUGE_PAGES=0)"
    ]
    monkeypatch.setenv(_pages.ENV_VAR, "1")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shardkit.kernels._pages"):
        _pages.apply_env()
    assert _stats()[0] == 1
    assert caplog.messages[0].startswith("2 MiB pages for compiled tables and optimizer state: ")
    assert "on (transparent huge pages: " in caplog.messages[0] or THP not in ("always", "madvise")
    set_huge_pages(False)  # the call overrides the environment, and the line says so
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shardkit.kernels._pages"):
        _pages.apply_env()
    assert _stats()[0] == 0
    assert caplog.messages == [
        "2 MiB pages for compiled tables and optimizer state: off (set_huge_pages(False))"
    ]


BAD_ENV = (
    r"SHARDKIT_HUGE_PAGES='maybe' is neither on nor off: it must be one of 1, on, true, yes "
    r"\(the default\) or 0, off, false, no; set it to 1 or 0, or unset it"
)


def test_env_var_that_is_neither_on_nor_off_is_refused(compiled, monkeypatch):
    monkeypatch.setenv(_pages.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=BAD_ENV):
        _pages.apply_env()
    assert _stats()[0] == 1


def test_bad_env_vars_are_refused_before_any_build_and_at_allocation(monkeypatch):
    def no_build():
        raise AssertionError("the kernel was built before the bad value was refused")

    monkeypatch.setattr(_select, "load_library", no_build)
    monkeypatch.setattr(_select, "_choice", None)
    monkeypatch.setenv(_pages.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=BAD_ENV):
        _select.kernel_path()
    with pytest.raises(ValueError, match=BAD_ENV):
        stack_tables(
            [MIB // 16], 64, dtype=torch.float32, device=torch.device("cpu"), optimizer=None
        )
    monkeypatch.setenv(_pages.ENV_VAR, "1")
    monkeypatch.setenv(_select.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=r"SHARDKIT_KERNEL: unknown embedding kernel 'fast'; "):
        advise_new_table(torch.empty(MIB))
    assert not advise_new_table(torch.empty(MIB, device="meta"))  # not a CPU table: not read


def _marked_huge(tensor: torch.Tensor) -> bool:
    """Whether a mapping inside ``tensor``'s storage carries MADV_HUGEPAGE (smaps's ``hg``)."""
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            mapping = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if mapping:
                inside = int(mapping[1], 16) < end and int(mapping[2], 16) > start
            elif inside and line.startswith("VmFlags:") and " hg" in line:
                return True
    return False


@needs_thp
@pytest.mark.parametrize("case", ["on", "off", "eager", "small", "to_empty"])
def test_tables_are_advised_when_allocated_before_their_first_write(case, monkeypatch):
    calls: list[tuple[int, int]] = []
    real = _libc._madvise()

    def recorded(address, length, advice):
        calls.append((address, length))
        return real(address, length, advice)

    monkeypatch.setattr(_libc, "_madvise", lambda: recorded)
    rows = 64 if case == "small" else MIB // 16  # 16 KiB, or 16 MiB of float32 x 64
    before = _pages.set_huge_pages(case != "off")
    try:
        with contextlib.ExitStack() as scope:
            if case == "eager":
                scope.enter_context(use_kernel("eager"))
            if case == "to_empty":  # a module built on meta, given memory later
                config = EmbeddingBagConfig(
                    name="t", embedding_dim=64, num_embeddings=rows, feature_names=["f"]
                )
                ebc = EmbeddingBagCollection(
                    tables=[config], fused_params={"optimizer": ADAM}, device="meta"
                )
                ebc.to_empty(device="cpu")
                tables = ebc._stack.groups[0].tables
            else:
                tables = stack_tables([rows], 64, dtype=torch.float32, device=torch.device("cpu"),
                                      optimizer=FusedOptimizerConfig(ADAM))  # fmt: skip
    finally:
        _pages.set_huge_pages(before)
        _pages._switched = None
    # (whether the first write then gets 2 MiB pages depends on free 2 MiB blocks: not asserted;
    # benchmarks/bench_huge_pages_first_step.py measures it)
    buffers = {"weight": tables.weight, **tables.optimizer.state}  # Adam's: 2 x the table
    advised = {name: _advised_inside(buffer, calls) for name, buffer in buffers.items()}
    assert advised == dict.fromkeys(buffers, case in ("on", "to_empty"))
    # (a buffer not advised now may still sit where an advised one was: its flag not asserted)
    assert all(_marked_huge(buffers[name]) for name in advised if advised[name])


def _advised_inside(tensor: torch.Tensor, calls: list[tuple[int, int]]) -> bool:
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    return any(start <= lo and lo + length <= end and length >= 2 * MIB for lo, length in calls)
