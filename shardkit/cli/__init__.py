"""The ``shardkit`` command line (also ``python -m shardkit``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from shardkit.checkpoint import CheckpointError
from shardkit.cli import _bench, _plan, _plot, _run, _train
from shardkit.launch import RankFailedError
from shardkit.planner import PlannerError

__all__ = ["main"]

_REFUSED = (ValueError, FileNotFoundError, CheckpointError, PlannerError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardkit",
        description="Model-parallel embeddings and fully sharded data parallel in plain PyTorch.",
        allow_abbrev=False,  # --epoch is not --epochs
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _train.add_parsers(commands)
    _bench.add_parser(commands)
    _plan.add_parser(commands)
    _run.add_parser(commands)
    _plot.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shardkit`` console script; returns the exit status."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # said by the subcommand's parser: its usage, not the top level's
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except (*_REFUSED, RankFailedError) as exc:
        # Refused input (in this process or in a rank): the message says what, the value and
        # the fix; the traceback would only bury it. --verbose shows it.
        refused = exc.exception if isinstance(exc, RankFailedError) else exc
        if args.verbose or not isinstance(refused, _REFUSED):
            raise
        where = f" (rank {exc.rank})" if isinstance(exc, RankFailedError) else ""
        print(f"shardkit {args.command}: error{where}: {refused}", file=sys.stderr)
        print("(--verbose shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
