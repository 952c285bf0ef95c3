#!/usr/bin/env bash
# Issue 51's GPU target, as one call of the `device` tool: the given suite (suites/budgets.yaml: SST-2,
# STS-B and CoLA at 0.01%, 0.05% and 0.5%, finals included) on one GPU, its studies side by side
# (`suite --jobs`, each study's trials one after another in its own process: `--executor local`, so
# Ray need not travel). Built here first:
#   GLUE_TASKS="SST-2 STS-B CoLA" bash bench/gpu_carry.sh        # .whl (optuna) and .gpu (weights, data)
# then, as the device tool's command (carry .whl and .gpu, about 60 MB with the repository):
#   bash bench/gpu_suite.sh                        (as the call's command, timeout_s 600)
# The suite runs under `timeout SUITE_S` (default 420 s, then at most 150 s for its studies to keep what
# they finished: inside one 600 s call); stopped there, the same call on the still-warm machine goes on
# from it (runs/ stays between calls there). What
# comes back in $OUT: the suite's table (suite.md, suite.json), its log, and the card's utilisation
# sampled every second (gpu.csv); the wall time is the log's last line. JOBS sets --jobs (default 9:
# every study at once; a task's smaller budgets start once its 0.5% study has measured the rates);
# SUITE another suite file (a tiny one checks the script on a CPU).
set -u
OUT=${OUT:-/tmp/gpu_suite_out}
mkdir -p "$OUT"
if [ -d .whl ]; then      # optuna and its SQL stack, for the device's Python (absent: already installed)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The backbone the suite names, all-MiniLM-L6-v2, resolves to a folder of that name where one exists:
# its fp32 weights, turned back from the fp16 copy that travelled. The suite reads ../shared/data/glue.
python3 - <<'PY' || exit 1
import shutil
from pathlib import Path
import torch, transformers
from safetensors.torch import load_file, save_file
if not Path("all-MiniLM-L6-v2/model.safetensors").is_file():
    shutil.copytree(".gpu/minilm", "all-MiniLM-L6-v2", dirs_exist_ok=True)
    weights = load_file(".gpu/minilm_fp16.safetensors")
    save_file({k: v.float().contiguous() for k, v in weights.items()}, "all-MiniLM-L6-v2/model.safetensors")
print("torch", torch.__version__, "| transformers", transformers.__version__, "|",
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
PY
mkdir -p ../shared/data
[ -e ../shared/data/glue ] || ln -s "$PWD/.gpu/glue" ../shared/data/glue
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > "$OUT/gpu.csv" 2>/dev/null &
SMI=$!
start=$(date +%s)
timeout --signal=TERM --kill-after=150 "${SUITE_S:-420}" python3 -m petl_nas.app.cli suite --experiment "${SUITE:-suites/budgets.yaml}" \
    --jobs "${JOBS:-9}" --executor local > "$OUT/suite.log" 2>&1
status=$?
kill "$SMI" 2>/dev/null
name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "${SUITE:-suites/budgets.yaml}")
cp "runs/$name/suite.md" "runs/$name/suite.json" "$OUT/" 2>/dev/null
grep -v "^\[" "$OUT/suite.log" | tail -40
echo "gpu_suite: exit status $status after $(( $(date +%s) - start )) s (124 or 143: stopped at SUITE_S; call again to go on)" \
    | tee -a "$OUT/suite.log"
exit "$status"
