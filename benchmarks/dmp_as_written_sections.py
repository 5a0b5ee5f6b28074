"""Where shardkit's step of `dmp_as_written.py` (a TorchRec program, run by ``shardkit run``)
spends its CPU time, per part (issue 25).

    nice -n 19 .venv/bin/python benchmarks/dmp_as_written_sections.py --type row_wise \
        --optimizer sgd --steps 15 [--tree OTHER_CHECKOUT ...]

The program runs unchanged but for `step_cpu_sections`' timers (the kernels, the row
bucketing, the ids' shift, the input and output distributions' pieces, each collective made
synchronous, and the rest: dense layers, autograd, optimizers, the modules' Python), 2 ranks x
1 thread on gloo. Each ``--tree`` (a checkout's root; default this one) runs in turn, trees
interleaved over ``--rounds``, so that two versions compare on one machine. Prints per part the
mean over ranks of the mean CPU ms per timed step, one column per (tree, round).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def instrumented(source: str) -> str:
    """`dmp_as_written.py` with the section timers around each step; rank r writes OUT.secR.json."""
    head = (
        "import sys, json as _json\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import step_cpu_sections as S\n"
    )
    edits = [
        ("parser = argparse.ArgumentParser()", "S.patch()\nparser = argparse.ArgumentParser()"),
        (
            "    loss = step(i)\n",
            "    if i == args.warmup:\n        S.SEC.clear()\n"
            "    S.enter('rest')\n    loss = step(i)\n    S.leave()\n",
        ),
        (
            "dist.destroy_process_group()",
            "_d = {k: v * 1e3 / args.steps for k, v in S.SEC.items()}\n"
            "_d['step'] = sum(_d.values())\n"
            "open(args.out + f'.sec{rank}.json', 'w').write(_json.dumps(_d))\n"
            "dist.destroy_process_group()",
        ),
    ]
    for old, new in edits:
        if old not in source:
            raise SystemExit(f"dmp_as_written.py changed: {old.strip()!r} not found; update me")
        source = source.replace(old, new, 1)
    return head + source


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--type", default="row_wise")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "rowwise_adagrad"])
    p.add_argument("--loop", default="plain", choices=["plain", "pipeline"])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tree", nargs="+", default=[str(HERE.parent)])
    a = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="dmp_sections."))
    program = scratch / "program.py"
    program.write_text(instrumented((HERE / "dmp_as_written.py").read_text()))
    print("load", os.getloadavg())
    columns: dict[str, list[dict]] = {}
    for r in range(a.rounds):
        for t, tree in enumerate(a.tree):
            out = scratch / f"t{t}_r{r}.json"
            env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1",
                   "PYTHONWARNINGS": "ignore"}  # fmt: skip
            cmd = [sys.executable, "-m", "shardkit", "run", "--nproc-per-node", "2", str(program),
                   str(out), "--type", a.type, "--optimizer", a.optimizer, "--loop", a.loop,
                   "--steps", str(a.steps)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            ranks = sorted(scratch.glob(f"{out.name}.sec*.json"))
            if done.returncode != 0 and not ranks:
                raise SystemExit(f"{tree}: failed: {done.stderr.strip()[-400:]}")
            columns[f"tree{t} r{r}"] = [json.loads(f.read_text()) for f in ranks]
    print(f"{a.type} {a.optimizer} {a.loop}; trees: " + ", ".join(
        f"tree{t} = {tree}" for t, tree in enumerate(a.tree)))  # fmt: skip
    keys = sorted({k for ranks in columns.values() for d in ranks for k in d})
    print("section".ljust(26) + "".join(f"{c:>12}" for c in columns))
    for k in keys:
        cells = [statistics.mean(d.get(k, 0.0) for d in ranks) for ranks in columns.values()]
        print(k.ljust(26) + "".join(f"{v:12.2f}" for v in cells))
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
