#!/usr/bin/env bash
# Every check of the planner's predictions (issue 29) on this machine, into OUTDIR (default
# benchmarks/results), in parts that each take under ~10 minutes on a quiet 2-core machine:
#
#   benchmarks/predict_checks.sh calibrate [OUTDIR]  # this host's profile (~1.5 min)
#   benchmarks/predict_checks.sh ranks-1-2 [OUTDIR]  # predicted vs measured at 1 and 2 ranks
#                                                     # with TorchRec's estimates (~8 min)
#   benchmarks/predict_checks.sh ranks-4 [OUTDIR]    # the same at 4 ranks (~13 min)
#   benchmarks/predict_checks.sh two-hosts [OUTDIR]  # two `torchrun --nnodes 2` agents on
#                                                     # localhost: calibrate, then the same (~5 min)
#   benchmarks/predict_checks.sh simulate [OUTDIR]   # the simulation checked against all of it
#                                                     # and TorchRec's published DLRM figure (~1 min)
#   benchmarks/predict_checks.sh all [OUTDIR]        # the five in turn (~25 min)
#
# Each part reads what the parts before it wrote into OUTDIR (the profiles; simulate: the
# measurements it finds there). Run them on a quiet machine. PREDICT_ARGS=--resample also
# re-samples the profile's speed points around each block of steps and reports the prediction
# from that re-sampled profile beside the calibrated one's ([Note: re-sampled profile]; about a
# minute more per part; off by default, see bench_predict.py's header). PREDICT_ARGS go to every
# bench_predict.py run and CALIBRATE_ARGS to every calibrate (a smoke run of the whole chain:
# PREDICT_ARGS="--cases dmp --rounds 1 --iters 2 --warmup 1" CALIBRATE_ARGS="--repeats 2
# --optimizers exact_row_wise_adagrad exact_adagrad").
set -euo pipefail
part=${1:-all}
out=${2:-benchmarks/results}
py=${PYTHON:-.venv/bin/python}
peers=${PEERS_PYTHON:-$HOME/.cache/shardkit-peers/venv/bin/python}
[ -x "$peers" ] || peers=$py  # without TorchRec: shardkit's side only
port=${PORT:-29611}
read -r -a predict_args <<< "${PREDICT_ARGS:-}"
read -r -a calibrate_args <<< "${CALIBRATE_ARGS:-}"
mkdir -p "$out"

two_agents() {  # the command after torchrun's arguments, on 2 "hosts" of 1 rank each
    for node in 0 1; do
        $py -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $node \
            --master-addr 127.0.0.1 --master-port $port "$@" &
    done
    wait
    port=$((port + 1))
}

one_host() {  # world sizes, report name
    local ws=$1 name=$2
    PYTHONPATH=$PWD $peers benchmarks/bench_predict.py --profile "$out/predict_profile.json" \
        --world-sizes $ws --out "$out/$name.md" "${predict_args[@]}"
}

run_part() {
    case $1 in
    calibrate)
        $py -m shardkit bench calibrate --out "$out/predict_profile.json" "${calibrate_args[@]}" ;;
    ranks-1-2) one_host "1 2" predict_ranks_1_2 ;;
    ranks-4) one_host 4 predict_ranks_4 ;;
    two-hosts)
        two_agents -m shardkit bench calibrate --out "$out/predict_profile_2hosts.json" \
            "${calibrate_args[@]}"
        two_agents benchmarks/bench_predict.py --profile "$out/predict_profile_2hosts.json" \
            --out "$out/predict_2hosts.md" "${predict_args[@]}" ;;
    simulate)
        local measured=()
        for f in "$out/predict_ranks_1_2.json" "$out/predict_ranks_4.json"; do
            [ -f "$f" ] && measured+=("$f")
        done
        local hosts=()
        [ -f "$out/predict_2hosts.json" ] && hosts=(--two-hosts "$out/predict_2hosts.json" \
            --two-hosts-profile "$out/predict_profile_2hosts.json")
        $py benchmarks/bench_simulate.py --profile "$out/predict_profile.json" \
            ${measured[@]+--measured "${measured[@]}"} ${hosts[@]+"${hosts[@]}"} \
            --out "$out/simulate.md" ;;
    *)
        echo "unknown part '$1': calibrate, ranks-1-2, ranks-4, two-hosts, simulate or all" >&2
        exit 2 ;;
    esac
}

if [ "$part" = all ]; then
    for p in calibrate ranks-1-2 ranks-4 two-hosts simulate; do run_part $p; done
else
    run_part "$part"
fi
