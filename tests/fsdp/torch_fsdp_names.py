"""The public names of torch's ``torch.distributed.fsdp`` and its public modules (issue 12).

    .venv/bin/python -m tests.fsdp.torch_fsdp_names     # rewrite torch_fsdp_names.json

For each module: its ``__all__`` and the public names defined in ``torch.distributed.fsdp`` that
it holds (what ``from torch.distributed.fsdp.X import Y`` can reach). Each entry says whether
shardkit offers the name at the same path, or refuses it (importing it raises an ImportError
with the reason, from ``shardkit.fsdp._refused``).
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import torch

LIST = Path(__file__).with_suffix(".json")
MODULES = ("", ".api", ".fully_sharded_data_parallel", ".sharded_grad_scaler", ".wrap")


def torch_names() -> list[tuple[str, str]]:
    """``(module suffix, name)`` for every public name, sorted."""
    out = set()
    for suffix in MODULES:
        module = importlib.import_module("torch.distributed.fsdp" + suffix)
        names = set(getattr(module, "__all__", ()))
        for name, value in vars(module).items():
            own = getattr(value, "__module__", "") or ""
            public = not name.startswith("_") and not inspect.ismodule(value)
            if public and own.startswith("torch.distributed.fsdp"):
                names.add(name)
        out.update((suffix, name) for name in names)
    return sorted(out)


def entries() -> list[dict[str, str]]:
    from shardkit.fsdp._refused import REFUSED

    out = []
    for suffix, name in torch_names():
        reason = REFUSED.get(("shardkit.fsdp" + suffix, name))
        entry = {"module": "torch.distributed.fsdp" + suffix, "name": name}
        entry.update({"status": "refused", "reason": reason} if reason else {"status": "offered"})
        out.append(entry)
    return out


def main() -> None:
    document = {"torch": torch.__version__.split("+")[0], "names": entries()}
    LIST.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{len(document['names'])} names written to {LIST}")


if __name__ == "__main__":
    main()
