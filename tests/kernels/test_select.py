"""Which kernel runs: chosen once per process, forced by SHARDKIT_KERNEL or `set_kernel`, and
eager (with one log line saying why) where the compiled kernel cannot be built."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardkit.kernels import KernelPath, _build, _select, kernel_path, set_kernel, use_kernel

# One training step of a fused-SGD collection, then the kernel that ran.
TRAIN = """
import logging, sys, torch
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.kernels import kernel_path
config = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])
ebc = EmbeddingBagCollection(tables=[config], fused_params={"optimizer": "sgd", "learning_rate": 1})
before = ebc.embedding_bags.t.weight.detach().clone()
kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2, 2]), lengths=torch.tensor([2, 1]))
ebc(kjt).values().sum().backward()
expected = before.clone()
expected[1] -= 1
expected[2] -= 2
torch.testing.assert_close(ebc.embedding_bags.t.weight.detach(), expected)
print("PATH", kernel_path().value)
"""


# The fresh processes the tests below read, by case: the environment each starts with
# (SHARDKIT_KERNEL unset unless it sets it; "{dir}" is the case's own empty folder).
CASES: dict[str, dict[str, str]] = {
    "eager": {"SHARDKIT_KERNEL": "eager", "SHARDKIT_CACHE_DIR": "{dir}"},
    "default": {},
    "no_compiler": {"CXX": "/nonexistent/c++", "SHARDKIT_CACHE_DIR": "{dir}"},
    "broken_compiler": {"CXX": "false", "SHARDKIT_CACHE_DIR": "{dir}"},
    "forced_without_compiler": {
        "SHARDKIT_KERNEL": "compiled",
        "CXX": "/nonexistent/c++",
        "SHARDKIT_CACHE_DIR": "{dir}",
    },
    "unwritable_cache": {"SHARDKIT_CACHE_DIR": "{dir}/file"},
}


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    dir: Path  # the case's folder


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """TRAIN in a new process for every case, all started at once: each is mostly the import of
    shardkit (seconds on 2 busy cores), and the kernel is chosen once per process."""
    started = {}
    for case, env in CASES.items():
        folder = tmp_path_factory.mktemp(case)
        if case == "unwritable_cache":
            (folder / "file").write_text("not a directory")
        env = {"SHARDKIT_KERNEL": "", **{k: v.format(dir=folder) for k, v in env.items()}}
        proc = subprocess.Popen([sys.executable, "-c", TRAIN], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **env})  # fmt: skip
        started[case] = (proc, folder)
    results = {}
    try:
        for case, (proc, folder) in started.items():
            out, err = proc.communicate(timeout=300)
            results[case] = Ran(proc.returncode, out, err, folder)
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def _train(ran: dict[str, Ran], case: str) -> tuple[str, Path]:
    """The standard output of a case that must succeed, and its folder."""
    result = ran[case]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout, result.dir


def _choice_line(out: str) -> str:
    lines = [line for line in out.splitlines() if "embedding kernel:" in line]
    assert len(lines) == 1, out  # one line, whatever the path
    return lines[0]


def test_env_var_forces_eager_without_building(ran):
    out, tmp_path = _train(ran, "eager")
    assert "embedding kernel: eager (asked for by SHARDKIT_KERNEL=eager)" in _choice_line(out)
    assert out.rstrip().endswith("PATH eager")
    assert not (tmp_path / "kernels").exists(), "forcing eager must not build anything"


def test_default_loads_the_cached_build(ran):
    """The session fixture (tests/conftest.py) has built it: a new process only loads it."""
    out, _ = _train(ran, "default")
    assert "SHARDKIT_KERNEL unset; C++ operators loaded from the cached build in" in _choice_line(
        out
    )
    assert out.rstrip().endswith("PATH compiled")


def test_missing_compiler_falls_back_to_eager(ran):
    out, _ = _train(ran, "no_compiler")
    assert (
        "embedding kernel: eager (SHARDKIT_KERNEL unset; the compiled kernel is unavailable: "
        "no C++ compiler: '/nonexistent/c++' is not on PATH"
    ) in _choice_line(out)
    assert out.rstrip().endswith("PATH eager")


def test_broken_compiler_falls_back_to_eager_and_keeps_its_output(ran):
    out, tmp_path = _train(ran, "broken_compiler")
    line = _choice_line(out)
    assert "the compiled kernel is unavailable: the build failed (" in line, line
    logs = list((tmp_path / "kernels").glob("*.log"))
    assert len(logs) == 1 and str(logs[0]) in line and logs[0].read_text()
    assert [p.name for p in (tmp_path / "kernels").iterdir() if p.is_dir()] == [], (
        "a failed build leaves no cache entry"
    )
    assert out.rstrip().endswith("PATH eager")


def test_compiled_forced_without_a_compiler_is_an_error(ran):
    result = ran["forced_without_compiler"]
    assert result.returncode != 0
    assert (
        "RuntimeError: the compiled embedding kernel was asked for by SHARDKIT_KERNEL=compiled "
        "but is unavailable: no C++ compiler: '/nonexistent/c++' is not on PATH (install g++, or "
        "set CXX). Fix that, or use SHARDKIT_KERNEL=auto to fall back to the eager kernel"
    ) in result.stderr


def test_set_kernel_chooses_for_the_process_and_logs_it(caplog, monkeypatch):
    monkeypatch.setattr(_select, "_choice", None)
    with caplog.at_level(logging.INFO, logger="shardkit.kernels"):
        assert set_kernel("eager") is KernelPath.EAGER
        assert kernel_path() is KernelPath.EAGER
        with use_kernel("compiled") as inner:
            assert inner is kernel_path() is KernelPath.COMPILED
        assert kernel_path() is KernelPath.EAGER
    assert [r.getMessage() for r in caplog.records] == [
        "embedding kernel: eager (asked for by set_kernel('eager'))"
    ]


def test_set_kernel_compiled_without_a_compiler_raises_and_keeps_the_choice(monkeypatch, tmp_path):
    monkeypatch.setattr(_select, "_choice", None)
    monkeypatch.setattr(_build, "_loaded_from", None)  # as in a process without the library
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path))
    with pytest.raises(
        RuntimeError,
        match=r"asked for by set_kernel\('compiled'\) but is unavailable: no C\+\+ compiler",
    ):
        set_kernel("compiled")
    assert _select._choice is None


def test_unknown_kernel_names_the_choices(monkeypatch):
    monkeypatch.setattr(_select, "_choice", None)
    monkeypatch.setenv("SHARDKIT_KERNEL", "fast")
    with pytest.raises(
        ValueError,
        match=r"SHARDKIT_KERNEL: unknown embedding kernel 'fast'; choose one of "
        r"\['eager', 'compiled', 'auto'\]",
    ):
        kernel_path()
    with pytest.raises(ValueError, match=r"set_kernel: unknown embedding kernel 'gpu'"):
        set_kernel("gpu")


def test_unwritable_cache_falls_back_to_eager(ran):
    out, folder = _train(ran, "unwritable_cache")
    blocked = folder / "file"
    assert f"the compiled kernel is unavailable: cannot build in {blocked}/kernels" in _choice_line(
        out
    )
    assert "set SHARDKIT_CACHE_DIR to a writable directory" in _choice_line(out)
    assert out.rstrip().endswith("PATH eager")
