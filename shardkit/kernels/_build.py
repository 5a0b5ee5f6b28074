"""Build the C++ operators on first use, cache the library, load it.

See [Note: compiled kernel]. The cache entry is a directory named by a hash of everything the
binary depends on (the sources, torch's version, Python's, the compiler flags and, since the code
is compiled for this CPU, the CPU's feature flags), so a stale library is never loaded. Ranks that
start at once take an exclusive lock on the entry: one builds into a private directory and
renames it into place, the others wait and load the result; a killed builder releases the lock
(it is an ``flock``) and leaves at most a private directory behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from shardkit.kernels import _pages

__all__ = ["BuildError", "build_cuda", "cache_root", "load_library"]

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
LIBRARY = "shardkit_kernels.so"
# Far above a build (about 20 s on 2 cores), far below a collective timeout's worth of waiting.
LOCK_TIMEOUT_S = 600.0

_CPU_SOURCES = ("forward.cpp", "grouping.cpp", "backward.cpp", "ops_cpu.cpp", "buckets.cpp")
_CUDA_SOURCES = ("ops_cuda.cu",)
_HEADERS = ("kernels.h", "common.h", "grouping.h")


class BuildError(RuntimeError):
    """The compiled kernel could not be built or loaded; the message says why."""


def cache_root() -> Path:
    """``$SHARDKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardkit``, else ``~/.cache/shardkit``."""
    if os.environ.get("SHARDKIT_CACHE_DIR"):
        return Path(os.environ["SHARDKIT_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardkit" / "kernels"


_lock = threading.Lock()
_loaded_from: Path | None = None  # this process's library: one per process, never replaced


def load_library() -> str:
    """Load the operators (building them first if no cached build fits); says how, for the log.

    Once loaded, later calls return at once: a process keeps the library it loaded, even if the
    sources change under it (a second library would register the ``shardkit`` ops twice, which
    torch answers with an abort).

    Raises:
        BuildError: no compiler, the build failed, or the library would not load.
    """
    with _lock:
        if _loaded_from is not None:
            return f"already loaded in this process from {_loaded_from}"
        return _load_first()


def _load_first() -> str:
    _check_toolchain()
    if _cuda_wanted():
        try:
            return _load(_CPU_SOURCES + _CUDA_SOURCES)
        except BuildError as error:
            logger.warning(
                "the CUDA kernel failed to build (%s); building the CPU one alone", error
            )
    return _load(_CPU_SOURCES)


def build_cuda() -> str:
    """Build (or find cached) and load the CPU and CUDA operators together, as `load_library`
    does on a machine with a GPU, but with no fallback: any failure is raised. Needs nvcc
    (``CUDA_HOME``), not a GPU: without one, ``TORCH_CUDA_ARCH_LIST`` names the architectures
    (``make check-cuda-build`` sets it to those of torch's own wheel).

    Raises:
        BuildError: torch is a CPU build, no nvcc, the build failed, or the library did not load.
    """
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None:
        raise BuildError(f"torch {torch.__version__} is a CPU build: install a CUDA build of torch")
    if CUDA_HOME is None:
        raise BuildError("no nvcc: set CUDA_HOME to a CUDA toolkit (e.g. pip's nvidia-cuda-nvcc)")
    with _lock:
        if _loaded_from is not None:
            raise BuildError(f"a library is already loaded in this process from {_loaded_from}")
        _check_toolchain()
        return _load(_CPU_SOURCES + _CUDA_SOURCES)


def _load(sources: tuple[str, ...]) -> str:
    flags = _cflags()
    entry = cache_root() / _key(sources, flags)
    library = entry / LIBRARY
    how = f"loaded from the cached build in {entry}"
    if not library.exists():
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            with _locked(entry.parent / f"{entry.name}.lock"):
                if not library.exists():
                    seconds = _build(entry, sources, flags)
                    how = f"built in {seconds:.1f} s into {entry}"
        except OSError as error:
            raise BuildError(
                f"cannot build in {entry.parent} ({error}); set SHARDKIT_CACHE_DIR to a writable "
                "directory"
            ) from error
    if not any(os.path.basename(path) == LIBRARY for path in torch.ops.loaded_libraries):
        try:  # (a build has loaded it already)
            torch.ops.load_library(str(library))
        except (OSError, RuntimeError) as error:
            raise BuildError(f"could not load {library}: {error}") from error
    _pages.apply_env()
    global _loaded_from
    _loaded_from = entry
    return how


def _cuda_wanted() -> bool:
    """A GPU that torch sees, and nvcc (``CUDA_HOME``) to compile for it."""
    if not torch.cuda.is_available():
        return False
    from torch.utils.cpp_extension import CUDA_HOME

    return CUDA_HOME is not None


def _check_toolchain() -> None:
    if sys.platform != "linux":
        raise BuildError(f"the compiled kernel is built on Linux only, not {sys.platform}")
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise BuildError(f"no C++ compiler: {compiler!r} is not on PATH (install g++, or set CXX)")
    if shutil.which("ninja") is None:
        raise BuildError("ninja is not on PATH (pip install ninja, or install it with apt)")


def _cflags(cpu_flags: str | None = None) -> list[str]:
    """The compiler's flags for this CPU (``cpu_flags``: /proc/cpuinfo's flags line, read when
    None). See [Note: AVX-512 lanes] in csrc/backward.cpp."""
    flags = ["-O3", "-std=c++17", "-fopenmp", "-fno-math-errno"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=native")  # this machine's vector width; the key records its flags
        features = (_cpu_flags() if cpu_flags is None else cpu_flags).split()
        if "avx512f" in features:
            # GCC tunes its Intel AVX-512 targets (skylake-avx512 to sapphirerapids) to 256-bit
            # vectors, and GCC 12 knows no Zen 4 (native gives znver3 tuning with AVX-512 on):
            # ask for zmm everywhere AVX-512 exists, as FBGEMM's AVX-512 kernels use them.
            flags.append("-mprefer-vector-width=512")
    return flags


def _key(sources: tuple[str, ...], flags: list[str]) -> str:
    digest = hashlib.sha256()
    for name in (*sources, *_HEADERS):
        digest.update(name.encode() + (CSRC / name).read_bytes())
    parts = [torch.__version__, sys.version, platform.machine(), " ".join(flags), _cpu_flags()]
    if any(name.endswith(".cu") for name in sources):
        capabilities = [
            torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())
        ]
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "")  # cpp_extension reads it
        parts += [str(torch.version.cuda), str(capabilities), arch_list]
    digest.update("\0".join(parts).encode())
    version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    return f"torch{version}-{digest.hexdigest()[:16]}"


def _cpu_flags() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith(("flags", "Features")):
                return line.strip()
    return platform.processor()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waited for at most `LOCK_TIMEOUT_S`."""
    import fcntl  # POSIX only; `_check_toolchain` has ruled the others out

    with open(path, "a") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise BuildError(f"cannot lock {path}: {error}") from error
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"waited {LOCK_TIMEOUT_S:.0f} s for another process building into "
                        f"{path.parent}; remove {path} if no build is running"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(entry: Path, sources: tuple[str, ...], flags: list[str]) -> float:
    """Compile into a private directory next to ``entry``, then rename it to ``entry``."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    start = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix=f"{entry.name}.", dir=entry.parent))
    logger.info("building shardkit's compiled kernel into %s (once per machine and version)", entry)
    try:
        for name in (*sources, *_HEADERS):
            shutil.copy(CSRC / name, scratch / name)
        with warnings.catch_warnings(record=True) as caught:
            cpp_extension.load(
                name=LIBRARY.removesuffix(".so"),
                sources=[str(scratch / name) for name in sources],
                extra_cflags=flags,
                extra_cuda_cflags=["-O3"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(scratch),
                is_python_module=False,
                verbose=False,
            )
        for warning in caught:
            logger.info("while building the compiled kernel: %s", warning.message)
        os.rename(scratch, entry)
    except Exception as error:
        log = entry.parent / f"{entry.name}.log"
        with contextlib.suppress(OSError):
            log.write_text(str(error))
        shutil.rmtree(scratch, ignore_errors=True)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BuildError(
            f"the build failed ({first}); the compiler's output is in {log}"
        ) from error
    return time.perf_counter() - start
