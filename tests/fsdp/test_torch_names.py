"""Every public name of torch's ``torch.distributed.fsdp`` (torch_fsdp_names.json, generated from
torch by tests/fsdp/torch_fsdp_names.py) exists at the same path under ``shardkit.fsdp``, or
importing it raises an ImportError that says why and what to use instead (issue 12)."""

from __future__ import annotations

import importlib
import json

import pytest

from tests.fsdp.torch_fsdp_names import LIST, entries

NAMES = json.loads(LIST.read_text())["names"]


def _path(entry):
    return entry["module"].replace("torch.distributed.fsdp", "shardkit.fsdp"), entry["name"]


def test_the_list_is_torchs():
    """Regenerate with ``python -m tests.fsdp.torch_fsdp_names`` when torch's names change."""
    assert entries() == NAMES


@pytest.mark.parametrize(
    "entry", [e for e in NAMES if e["status"] == "offered"], ids=lambda e: "/".join(_path(e))
)
def test_offered_names_import_from_the_same_path(entry):
    module, name = _path(entry)
    value = getattr(importlib.import_module(module), name)
    torch_value = getattr(importlib.import_module(entry["module"]), name)
    assert type(value) is type(torch_value) or isinstance(value, type) == isinstance(
        torch_value, type
    ), (value, torch_value)
    if isinstance(torch_value, type) and hasattr(torch_value, "__members__"):  # enums
        assert set(value.__members__) == set(torch_value.__members__)


@pytest.mark.parametrize(
    "entry", [e for e in NAMES if e["status"] == "refused"], ids=lambda e: "/".join(_path(e))
)
def test_refused_names_say_why(entry):
    module, name = _path(entry)
    with pytest.raises(ImportError) as info:
        exec(f"from {module} import {name}", {})
    assert str(info.value) == f"{module}.{name} is not offered by shardkit: {entry['reason']}"


def test_coverage():
    offered = sum(e["status"] == "offered" for e in NAMES)
    assert offered / len(NAMES) >= 0.9, (offered, len(NAMES))
