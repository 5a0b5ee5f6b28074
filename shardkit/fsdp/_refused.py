"""Names of ``torch.distributed.fsdp`` that cannot work on shardkit: importing one raises an
ImportError that says why and what to use instead (tests/fsdp/torch_fsdp_names.json lists them
with the same reasons)."""

from __future__ import annotations

__all__ = ["REFUSED", "refuse"]

_FLAT = (
    "shardkit keeps the original parameters (FSDP1's use_orig_params=True), so there is no flat "
    "parameter; use module.parameters()"
)
_RUNTIME = "internal state of torch's FSDP1 runtime, which shardkit's units do not have"

# (module, name) -> why it cannot work, and the alternative
REFUSED: dict[tuple[str, str], str] = {
    ("shardkit.fsdp", "FlatParameter"): _FLAT,
    ("shardkit.fsdp.fully_sharded_data_parallel", "FlatParameter"): _FLAT,
    ("shardkit.fsdp.fully_sharded_data_parallel", "FlatParamHandle"): _FLAT,
    ("shardkit.fsdp.fully_sharded_data_parallel", "HandleTrainingState"): _RUNTIME,
    ("shardkit.fsdp.fully_sharded_data_parallel", "TrainingState"): _RUNTIME,
}


def refuse(module: str, name: str) -> Exception:
    """What a module's ``__getattr__`` raises for ``name``: an ImportError for a refused name of
    torch's, else the usual AttributeError."""
    reason = REFUSED.get((module, name))
    if reason is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    return ImportError(f"{module}.{name} is not offered by shardkit: {reason}")
