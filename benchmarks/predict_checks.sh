#!/usr/bin/env bash
# Every check of the planner's predictions (issue 29) on this machine, into OUTDIR (default
# benchmarks/results): calibrate; predicted vs measured DMP steps at 1, 2 and 4 ranks with
# TorchRec's estimates (peers venv); the same under two `torchrun --nnodes 2` agents on
# localhost, after calibrating under them; the simulation checked against all of it and
# against TorchRec's published DLRM figure. Run it on a quiet machine: about 40 minutes.
#
#   benchmarks/predict_checks.sh [OUTDIR]
set -euo pipefail
out=${1:-benchmarks/results}
py=${PYTHON:-.venv/bin/python}
peers=${PEERS_PYTHON:-$HOME/.cache/shardkit-peers/venv/bin/python}
[ -x "$peers" ] || peers=$py  # without TorchRec: shardkit's side only
port=${PORT:-29611}
mkdir -p "$out"

$py -m shardkit bench calibrate --out "$out/predict_profile.json"
PYTHONPATH=$PWD $peers benchmarks/bench_predict.py --profile "$out/predict_profile.json" \
    --out "$out/predict.md"

two_agents() {  # the command after torchrun's arguments, on 2 "hosts" of 1 rank each
    for node in 0 1; do
        $py -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $node \
            --master-addr 127.0.0.1 --master-port $port "$@" &
    done
    wait
    port=$((port + 1))
}
two_agents -m shardkit bench calibrate --out "$out/predict_profile_2hosts.json"
two_agents benchmarks/bench_predict.py --profile "$out/predict_profile_2hosts.json" \
    --out "$out/predict_2hosts.md"

$py benchmarks/bench_simulate.py --profile "$out/predict_profile.json" \
    --measured "$out/predict.json" --two-hosts "$out/predict_2hosts.json" \
    --two-hosts-profile "$out/predict_profile_2hosts.json" --out "$out/simulate.md"
