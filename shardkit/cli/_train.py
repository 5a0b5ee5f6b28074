"""``shardkit train`` (the main job), ``shardkit export`` and ``shardkit import``.

``train``'s flags are `TrainConfig`'s fields, derived here rather than copied: each field is a
flag (``data_path`` is ``--data-path``; a field's ``metadata`` may give its ``flag`` and
``metavar``), its help is
the field's entry in the ``Attributes`` of `TrainConfig`'s docstring, its default the field's.
Booleans that default to True become ``--no-<name>``, enums choices, tuples of ints a comma list
(``--dense-arch 64,16``), tuples of paths one or more paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import logging
import sys
import types
import typing
from pathlib import Path
from typing import Any

from shardkit.cli._export import QUANTIZE_CHOICES, export, export_pt2
from shardkit.cli._units import size
from shardkit.train import TrainConfig, run

__all__ = ["add_parsers", "show_training_log", "train_flags"]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where there is none to show (None, False, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        if default is None or isinstance(default, bool) or default == () or default == "":
            return action.help
        return super()._get_help_string(action)


def add_parsers(commands: Any) -> None:
    _train_parser(commands)
    export = commands.add_parser(
        "export",
        help="write a checkpoint's model as one unsharded file",
        description="Write a checkpoint's model as one unsharded state dict file; for a run on "
        "table data, also its fitted schema next to it (<output>.schema.json), which maps raw "
        "values as training did (shardkit.data.FittedSchema.load).",
        allow_abbrev=False,
    )
    export.add_argument("checkpoint", type=Path, help="a step-* directory, or a root with 'latest'")
    export.add_argument(
        "output", type=Path, help="the file to write (.pt, or .pt2 with --format pt2)"
    )
    export.add_argument("--quantize", choices=list(QUANTIZE_CHOICES),
                        help="store the tables so for serving on CPU (see docs/serving.md)")  # fmt: skip
    export.add_argument("--format", choices=["state_dict", "pt2"], default="state_dict",
                        help="state_dict: a torch.save file; pt2: a torch.export program that "
                        "a process with only torch serves (see docs/pt2.md)")  # fmt: skip
    export.add_argument("--aoti", action="store_true",
                        help="with --format pt2, also an AOTInductor package for this CPU "
                        "(<stem>-aoti.pt2; a C++ build of 20-60 s)")  # fmt: skip
    export.set_defaults(run=_export, parser=export)
    imp = commands.add_parser(
        "import",
        help="turn an unsharded .pt state dict into a checkpoint",
        allow_abbrev=False,
    )
    imp.add_argument("state_file", type=Path, help="a torch.save'd model state dict")
    imp.add_argument(
        "checkpoint_dir", type=Path, help="where the checkpoint goes (--resume reads it)"
    )
    imp.set_defaults(run=_import, parser=imp)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None


def _train_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "train",
        help="train a DLRM with sharded embedding tables (the main job)",
        description="Train DLRM (or DCN-v2) with its embedding tables sharded over ranks, the "
        "train pipeline, fused row-wise Adagrad for tables and Adam for the rest; validate "
        "every epoch (AUC, log loss across ranks) and checkpoint. Defaults: UCI Adult, 2 ranks. "
        "Your own data: --data table --data-path FILES --schema SCHEMA (docs/data.md).",
        formatter_class=_Help,
        allow_abbrev=False,
    )
    for name, kwargs in train_flags().items():
        parser.add_argument(name, **kwargs)
    parser.set_defaults(run=_train, parser=parser)


def train_flags() -> dict[str, dict[str, Any]]:
    """``flag -> add_argument keywords`` for every `TrainConfig` field (see the module doc)."""
    docs, hints = field_docs(), typing.get_type_hints(TrainConfig)
    flags = {}
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else None
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        assert f.name in docs, (
            f"TrainConfig.{f.name} has no entry in the Attributes of TrainConfig's docstring; "
            "add one: it is the flag's help"
        )
        kwargs: dict[str, Any] = {"dest": f.name, "help": docs[f.name], "default": default}
        kind = _base(hints[f.name])
        if kind is bool:
            if default:
                flag = "--no-" + f.name.replace("_", "-")
                kwargs["help"] = f"turn off {docs[f.name]}"
            kwargs["action"] = "store_false" if default else "store_true"
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            kwargs.update(choices=[m.value for m in kind], default=getattr(default, "value", None))
        elif typing.get_origin(kind) is tuple:
            if typing.get_args(kind)[0] is int:
                kwargs.update(
                    type=_ints, default=",".join(map(str, default or ())), metavar="N,N,..."
                )
            else:
                kwargs.update(type=Path, nargs="+", metavar="PATH")
        elif f.metadata.get("bytes"):
            kwargs["type"] = size  # 8G, 512M, 1.5T or a plain number of bytes
        else:
            kwargs["type"] = kind
            if kind is Path:
                kwargs["metavar"] = "PATH"
        if "metavar" in f.metadata:
            kwargs["metavar"] = f.metadata["metavar"]
        flags[flag] = kwargs
    return flags


def field_docs() -> dict[str, str]:
    """Each field's text in `TrainConfig`'s ``Attributes`` (the command line's help)."""
    section = inspect.cleandoc(TrainConfig.__doc__ or "").split("Attributes:\n", 1)[1]
    lines = [line for line in section.splitlines() if line.strip()]
    indent = len(lines[0]) - len(lines[0].lstrip())
    docs: dict[str, str] = {}
    for line in lines:
        if len(line) - len(line.lstrip()) == indent:
            name, _, text = line.strip().partition(": ")
            docs[name] = text
        else:
            docs[name] += " " + line.strip()
    return docs


def _base(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _train(args: argparse.Namespace) -> int:
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    run(config, rank_setup=show_training_log)
    return 0


def show_training_log() -> None:
    """In a rank's process: the ``shardkit.train`` log (rank 0's plan, progress, metrics and
    checkpoints) on standard output, as plain lines."""
    log = logging.getLogger("shardkit.train")
    if not log.handlers:  # once per process
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _export(args: argparse.Namespace) -> int:
    from shardkit.checkpoint import read_extra
    from shardkit.data import FittedSchema

    if args.aoti and args.format != "pt2":
        args.parser.error("--aoti needs --format pt2")
    schema = read_extra(args.checkpoint).get("schema")
    if args.format == "pt2":
        print(export_pt2(args.checkpoint, args.output, args.quantize, aoti=args.aoti,
                         schema=schema))  # fmt: skip
    else:
        print(export(args.checkpoint, args.output, args.quantize))
    if schema is not None:
        path = args.output.with_suffix(".schema.json")
        FittedSchema.from_dict(schema).save(path)
        print(f"wrote its fitted schema (vocabularies, transforms) to {path}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from shardkit.checkpoint import import_checkpoint

    path = import_checkpoint(args.state_file, args.checkpoint_dir)
    print(f"wrote checkpoint {path}")
    return 0
