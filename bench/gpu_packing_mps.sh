#!/usr/bin/env bash
# Packing graphed trials on one GPU without and with CUDA MPS, one after the other on the same card, as
# one call of the `device` tool (carry .whl, .whl_ray, .gpu/glue and .gpu/minilm, built here by
# bench/gpu_carry.sh). Without MPS, the trials' processes share the GPU by time-slicing: one context's kernels
# at a time. With MPS (nvidia-cuda-mps-control -d before Ray starts; its workers inherit the pipe
# directory) their kernels can run side by side. Each run is bench/gpu_packing.py (alone, then packed)
# with its own time limit (PLAIN_S, MPS_S; 0 skips that half); ALONE and PACKED set the trial counts
# (a packed search of 48 trials runs each packed worker 3 times: the steady state, not only cold
# starts; give it ~400 s). Within a half's limit, the alone search stops after ALONE_LIMIT_S (default
# 100) and the packed one at what is left less 40 s (Ray's start, the random copy), each then measured on
# what it completed, so a slow half still writes its table. The tables land in $OUT.
# Issue 52's end-to-end rate (a search of >= 200 graphed trials, >= 1,500 per hour wanted), ready
# for the next session lent a GPU, in one call of at most 600 s:
#   PLAIN_S=460 MPS_S=0 ALONE=3 ALONE_LIMIT_S=60 PACKED=240 bash bench/gpu_packing_mps.sh
# (the packed search is cut after 360 s and measured on what it completed).
set -u
OUT=${OUT:-/tmp/gpu_packing_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl .whl_ray/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd bench
run() {
    [ "$1" = 0 ] && return
    local alone=${ALONE_LIMIT_S:-100}
    if [ $(( $1 - alone - 40 )) -le 0 ]; then echo "gpu_packing_mps: $1 s leave the packed search no time after ALONE_LIMIT_S=$alone and 40 s"; return; fi
    # the outer limit leaves each search's 60 s to stop (search_runs.STOP_GRACE_S) on top
    timeout "$(( $1 + 130 ))" python3 gpu_packing.py --alone-limit-s "$alone" --packed-limit-s "$(( $1 - alone - 40 ))" --experiment "$PWD/gpu_packing_graphs.yaml" --model ../.gpu/minilm \
        --random-init /tmp/minilm-random --data-dir ../.gpu/glue --alone "${ALONE:-5}" --packed "${PACKED:-16}" \
        --out "$OUT/$2.md" 2>&1 | tee "$OUT/$2.log" | grep -v Warning | tail -8
}
run "${PLAIN_S:-200}" packing_plain
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p /tmp/mps_pipe /tmp/mps_log
if [ "${MPS_S:-200}" = 0 ]; then
    :
elif nvidia-cuda-mps-control -d; then
    run "${MPS_S:-200}" packing_mps
    echo get_server_list | nvidia-cuda-mps-control
    echo quit | nvidia-cuda-mps-control
else
    echo "MPS did not start"
fi
tail -20 /tmp/mps_log/control.log > "$OUT/mps_control.log" 2>/dev/null
