"""init_from_env: clear errors without a launcher, and real torchrun jobs on one and two nodes."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from shardkit.launch import init_from_env
from shardkit.launch._env import _read

FULL = {
    "RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_reads_torchrun_variables():
    values = _read(FULL)
    assert (values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"]) == (1, 4, 1)
    assert values["LOCAL_WORLD_SIZE"] == 2


def test_local_world_size_defaults_to_world_size():
    env = {k: v for k, v in FULL.items() if k != "LOCAL_WORLD_SIZE"}
    assert _read(env)["LOCAL_WORLD_SIZE"] == 4


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"RANK": None}, r"RANK is not set: start the script with torchrun"),
        ({"RANK": None, "MASTER_PORT": None}, r"RANK, MASTER_PORT are not set"),
        ({"WORLD_SIZE": "four"}, r"WORLD_SIZE must be an integer, got 'four'"),
        ({"RANK": "4"}, r"RANK \(4\) must be in \[0, WORLD_SIZE=4\)"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK \(2\) must be in \[0, LOCAL_WORLD_SIZE=2\)"),
        ({"LOCAL_WORLD_SIZE": "8"}, r"LOCAL_WORLD_SIZE \(8\) cannot exceed WORLD_SIZE \(4\)"),
    ],
)
def test_bad_environment(change, pattern):
    env = {**FULL, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(ValueError, match=pattern):
        init_from_env(environ=env)


SCRIPT = textwrap.dedent(
    """
    import os
    import torch, torch.distributed as dist
    from shardkit.launch import init_from_env, shutdown

    info = init_from_env(timeout=60)
    t = torch.tensor([float(info.rank)])
    dist.all_reduce(t)
    line = (f"rank={info.rank} world={info.world_size} local={info.local_rank}/"
            f"{info.local_world_size} host={info.host_index} backend={info.backend} sum={t.item()}")
    os.write(1, (line + "\\n").encode())  # one write: the ranks share the pipe
    shutdown()
    """
)


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _lines(*outputs: str) -> list[str]:
    return sorted(line for out in outputs for line in out.splitlines() if line.startswith("rank="))


def test_torchrun_one_node(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        _torchrun("--standalone", "--nproc-per-node=2", str(script)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout) == [
        "rank=0 world=2 local=0/2 host=0 backend=gloo sum=1.0",
        "rank=1 world=2 local=1/2 host=0 backend=gloo sum=1.0",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~20 s; one node in the default run: test_torchrun_one_node
def test_torchrun_two_nodes(tmp_path):
    """Two torchrun agents on this machine stand for two hosts with 2 ranks each."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = _free_port()
    nodes = [
        subprocess.Popen(
            _torchrun(
                "--nnodes=2",
                "--nproc-per-node=2",
                f"--node-rank={node}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                str(script),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in range(2)
    ]
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err
    assert _lines(*(out for out, _ in outputs)) == [
        f"rank={r} world=4 local={r % 2}/2 host={r // 2} backend=gloo sum=6.0" for r in range(4)
    ]
