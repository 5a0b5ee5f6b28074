"""``shardkit run script.py [args]``: an unmodified TorchRec program, on shardkit.

    shardkit run train.py --epochs 1                      # one process
    shardkit run --nproc-per-node 2 train.py              # two ranks, torchrun's variables set
    torchrun --nproc-per-node 2 -m shardkit run train.py  # the same under torchrun

The program's ``import torchrec...`` and ``import fbgemm_gpu...`` resolve to shardkit
([Note: the import aliases] in ``shardkit.compat``); where there is no GPU, ``"cuda"`` runs on
``"cpu"`` and ``"nccl"`` on ``"gloo"`` ([Note: cuda on cpu]), said in one line. It then runs as
``__main__`` with ``sys.argv`` set to the script and its arguments. Python processes the program
starts itself get the same mapping through their environment ([Note: child processes]).
"""

from __future__ import annotations

import os
import runpy
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from shardkit.comm import watch_torch_collectives
from shardkit.compat import carry_to_children, install_aliases, map_cuda_to_cpu

__all__ = ["add_parser", "run_program"]

_FSDP_NOTE = (
    "shardkit run: this program imports torch.distributed.fsdp, which stays torch's (torch's own "
    "modules import its internals); rewrite it to shardkit.fsdp to run FSDP on shardkit"
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="run a TorchRec program unchanged, on shardkit",
        description="Run SCRIPT with 'torchrec' and 'fbgemm_gpu' imports resolving to shardkit, "
        "'cuda'/'nccl' mapped to 'cpu'/'gloo' when there is no GPU.",
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="start N local ranks with torchrun's environment (default: this one process)",
    )
    parser.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name")
    parser.add_argument(
        "script", metavar="SCRIPT", help="the program (a .py file, or a module with -m)"
    )
    parser.add_argument("script_args", nargs="...", metavar="ARGS", help="the program's arguments")
    parser.set_defaults(run=_run)


def _run(args: Any) -> int:
    if args.nproc_per_node is not None:
        if args.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
        return _launch(args)
    return run_program(args.script, args.script_args, module=args.module)


def run_program(script: str, script_args: list[str], *, module: bool = False) -> int:
    """Run ``script`` (a path, or a module name) as ``__main__`` in this process, on shardkit."""
    if not module and not Path(script).is_file():
        raise FileNotFoundError(f"shardkit run: no such program {script!r}")
    install_aliases()
    first_rank = os.environ.get("RANK", "0") == "0"
    cuda_on_cpu = not torch.cuda.is_available()
    if cuda_on_cpu:
        line = map_cuda_to_cpu()
        if first_rank:
            print(f"shardkit run: {line}", file=sys.stderr, flush=True)
    carry_to_children(cuda_on_cpu=cuda_on_cpu)  # the Pythons the program starts: the same
    watch_torch_collectives()  # its own collectives wait for gloo at exit too: [Note: gloo at exit]
    if first_rank and not module and "torch.distributed.fsdp" in Path(script).read_text():
        print(_FSDP_NOTE, file=sys.stderr, flush=True)
    sys.argv = [script, *script_args]
    try:
        if module:
            sys.path.insert(0, os.getcwd())  # as python -m does
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(script).resolve().parent))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # the program's own error: its traceback, as python would show it
        traceback.print_exc()
        return 1
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: Any) -> int:
    """Start the ranks as torchrun does on one host; when one fails, stop the others (no rank
    is left waiting for it) and return its exit status."""
    n = args.nproc_per_node
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0"}  # fmt: skip
    command = [sys.executable, "-m", "shardkit", "run", *(["-m"] if args.module else []),
               args.script, *args.script_args]  # fmt: skip
    ranks = [
        subprocess.Popen(command, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(n)
    ]
    try:
        while True:
            codes = [p.poll() for p in ranks]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(f"shardkit run: rank {rank} exited with {code}; stopping the others",
                      file=sys.stderr, flush=True)  # fmt: skip
                return code
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.terminate()
        for p in ranks:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
