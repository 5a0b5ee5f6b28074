"""How shardkit's modules may depend on each other (../shared/STYLE.md, "Layering"):

- packages only import packages below them: each package lists the shardkit packages it may
  import, and those lists form no circle;
- a package uses another only through its public names: no import of another package's
  ``_private`` module, nor of a ``_private`` name from it;
- no import cycles between modules, counting imports inside functions and under
  ``TYPE_CHECKING``: a circle hidden in a function is still a circle.

The test reads every module's imports with `ast`; it imports nothing of ours but the package path.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import shardkit

ROOT = Path(shardkit.__file__).parent

# Every package may import these (they import nothing of ours): TorchRec-name refusals,
# TorchRec's stream interfaces and its 4- and 2-bit tensor types.
BOTTOM = {"compat", "streamable", "tensor_types"}

# package -> shardkit packages it may import (besides itself and BOTTOM)
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "compat": set(),
    "streamable": set(),
    "tensor_types": set(),
    "launch": set(),
    "comm": {"launch"},
    "sparse": set(),
    "optim": {"types"},
    "kernels": {"types", "optim"},
    "modules": {"types", "sparse", "optim", "kernels"},
    "planner": {"types", "sparse", "modules", "optim"},
    "sharding": {"types", "launch", "comm", "sparse", "modules", "optim", "planner", "fsdp",
                 "kernels"},
    "distributed": {"types", "launch", "comm", "sparse", "modules", "optim", "planner", "sharding",
                    "quant", "inference"},  # TorchRec's distributed.quant_embeddingbag path
    "fsdp": {"comm", "launch"},
    "models": {"types", "sparse", "modules", "optim"},
    "quant": {"types", "sparse", "modules", "optim"},
    "inference": {"types", "launch", "comm", "sparse", "modules", "optim", "quant", "sharding",
                  "kernels"},
    "data": {"sparse"},
    "datasets": {"sparse", "data"},
    "fbgemm_gpu": {"types", "optim", "sparse", "modules"},
    "metrics": {"comm", "launch"},
    "checkpoint": {"types", "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "fsdp"},
    "bench": {"types", "launch", "comm", "sparse", "modules", "optim", "kernels", "planner", "sharding", "fsdp"},
    "cli": {
        "types", "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "distributed",
        "fsdp", "models", "data", "checkpoint", "bench", "train", "metrics", "quant",
        "inference",
    },
    "train": {
        "types", "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "distributed",
        "fsdp", "models", "data", "checkpoint", "metrics",
    },
}  # fmt: skip

# Single modules allowed more than their package: the planner is a pure function with no
# process group, except `collective_plan`, which plans on rank 0 and broadcasts; the data
# readers need none, except the table scan's parallel form (`scan_table(parallel=True)`),
# which merges the ranks' parts with all-gathers; the scan also fixes glibc's heap thresholds
# as a training step does (`shardkit.kernels.steady_heap`: its pieces' temporaries stay mapped).
ALLOWED_MODULES: dict[str, set[str]] = {
    "planner/_collective.py": {"comm", "launch"},
    "data/_table_scan.py": {"comm", "launch", "kernels"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imported(path: Path) -> Iterator[str]:
    """Every shardkit name ``path`` imports, dotted: ``from shardkit.comm import label`` gives
    ``shardkit.comm.label``, ``import shardkit.planner`` gives ``shardkit.planner``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        yield from (name for name in names if name.split(".")[0] == "shardkit")


def _target(name: str) -> str:
    """The module an imported name comes from: the longest prefix that is a module."""
    parts = name.split(".")
    while ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def _package(module: str) -> str | None:
    """``shardkit.planner._core`` -> ``planner``; None for shardkit's own ``__init__``/``__main__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and not parts[1].startswith("__") else None


def _private(module: str) -> bool:
    """``shardkit.planner._core`` is; a package's ``__init__`` (``shardkit.planner``) counts as
    private too: its names are the package's."""
    return module.count(".") == 1 or module.rsplit(".", 1)[1].startswith("_")


def _library_modules() -> Iterator[tuple[str, Path, str]]:
    for module, path in MODULES.items():
        package = _package(module)
        if package is not None:
            yield module, path, package


def test_packages_only_import_downwards():
    problems = []
    for _module, path, package in _library_modules():
        assert package in ALLOWED, f"new package {package!r}: add it to ALLOWED with its layer"
        relative = path.relative_to(ROOT).as_posix()
        allowed = ALLOWED[package] | ALLOWED_MODULES.get(relative, set()) | {package}
        if package not in BOTTOM:
            allowed |= BOTTOM
        for name in _imported(path):
            if name == "shardkit":
                continue  # `import shardkit` for its __version__ (bench): nothing else
            target = _package(_target(name))
            if target is None:
                problems.append(f"{relative} imports {name} from the top-level shardkit package")
            elif target not in allowed:
                problems.append(f"{relative} imports {name} (package {target!r})")
    assert not problems, "\n".join(problems)


def test_the_layers_form_no_circle():
    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for below in ALLOWED[start]:
            if below == goal or (below not in seen and reaches(below, goal, seen | {below})):
                return True
        return False

    circles = [package for package in ALLOWED if reaches(package, package, set())]
    assert not circles, f"ALLOWED lets these packages import themselves back: {circles}"


def test_no_package_imports_another_packages_private_modules():
    problems = []
    for _module, path, package in _library_modules():
        for name in _imported(path):
            parts = name.split(".")
            if (
                len(parts) > 1
                and parts[1] != package
                and any(part.startswith("_") for part in parts[2:])
            ):
                relative = path.relative_to(ROOT).as_posix()
                problems.append(
                    f"{relative} imports {name}: use the names shardkit.{parts[1]} exports"
                )
    assert not problems, "\n".join(problems)


def _edge_private(name: str) -> bool:
    """``shardkit.distributed._tracing.x``, ``shardkit.distributed.planner._tr_types.X``: a
    private module of the edge itself."""
    parts = name.split(".")
    return parts[1] == "distributed" and any(part.startswith("_") for part in parts[2:-1])


# Public modules of the core beside their package's __init__, each the one home of its names
# (none of them is in the package's __all__): the planner's steps, for the edge's components.
PUBLIC_SUBMODULES = {"shardkit.planner.steps"}


def test_public_submodules_are_the_one_home_of_their_names():
    import importlib

    for module in PUBLIC_SUBMODULES:
        names = set(importlib.import_module(module).__all__)
        package = importlib.import_module(module.rsplit(".", 1)[0])
        assert not names & set(package.__all__), f"{module} and its package both export them"


def test_torchrec_paths_only_reexport_package_names():
    """``shardkit.distributed`` mirrors ``torchrec.distributed.*``: its public modules re-export
    what the packages below export, or what its own private modules define (TorchRec's
    vocabulary that shardkit's core does not use); the core's middle modules are private, so
    each name has one public home."""
    problems = []
    for module, path, package in _library_modules():
        if package == "distributed" and not module.rsplit(".", 1)[1].startswith("_"):
            names = [
                name for name in _imported(path) if name.count(".") != 2 and not _edge_private(name)
            ]
            problems += [f"{module} imports {name}, not a package's name" for name in names]
        elif (
            package in ("types", "planner", "sharding")
            and not _private(module)
            and module not in PUBLIC_SUBMODULES
        ):
            problems.append(f"{module} is public: make it private, export from __init__")
    assert not problems, "\n".join(problems)


# TorchRec's and FBGEMM's import paths: the compatibility edge, built over the packages' public
# names (../shared/STYLE.md, "Compatibility at the edge").
EDGE = {"distributed", "fbgemm_gpu"}
# What speaks shardkit's own vocabulary, and so imports nothing from the edge.
CORE = {"types", "sparse", "optim", "kernels", "modules", "planner", "sharding", "comm", "launch"}


def test_the_core_imports_nothing_from_the_compatibility_edge():
    """``sharding/`` and ``planner/`` (and what they stand on) never reach up into TorchRec's
    paths, counting imports inside functions and under ``TYPE_CHECKING``: the edge can be
    read, tested and versioned on its own."""
    problems = []
    for _module, path, package in _library_modules():
        if package not in CORE:
            continue
        for name in _imported(path):
            if _package(_target(name)) in EDGE:
                problems.append(f"{path.relative_to(ROOT).as_posix()} imports {name} (the edge)")
    assert not problems, "\n".join(problems)


def _graph() -> dict[str, set[str]]:
    return {
        module: {_target(name) for name in _imported(path)} - {module}
        for module, path in MODULES.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                found.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_between_modules():
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(
        ", ".join(sorted(c)) for c in cycles
    )


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [{"a", "b", "c"}]
