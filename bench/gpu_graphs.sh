#!/usr/bin/env bash
# Issue 17's CUDA-graph measurements on one GPU, as one call of the `device` tool (what travels, built
# here by bench/gpu_carry.sh: .whl/ holds optuna and its SQL stack as wheels, .gpu/ the
# all-MiniLM-L6-v2 weights in fp16 with its config and vocabulary, and SST-2). In order: the GPU
# tests of step_graphs, the small-operation A/B cases not yet measured on a GPU
# (bench/gpu_kernels_ab.py --only "$AB_ONLY"), two presets' trials eager against graphed
# (bench/trial_throughput.py), and the step-time table with every row also graphed
# (bench/step_time.py --graphs). Each part has its
# own time limit, so a slow one leaves the others their turn (a limit of 0 skips that part); every
# output also lands in $OUT, the step table's kernel breakdown (`--kernels`) too.
set -u
OUT=${OUT:-/tmp/gpu_graphs_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 - <<'PY'
import shutil
import torch, transformers
from safetensors.torch import load_file, save_file
shutil.copytree(".gpu/minilm", "/tmp/minilm", dirs_exist_ok=True)
weights = load_file(".gpu/minilm_fp16.safetensors")
save_file({k: v.float().contiguous() for k, v in weights.items()}, "/tmp/minilm/model.safetensors")
print("torch", torch.__version__, "| transformers", transformers.__version__, "|", torch.cuda.get_device_name())
PY
[ "${PYTEST_S:-60}" = 0 ] || timeout "${PYTEST_S:-60}" python3 -m pytest -q -p no:cacheprovider tests/training/test_step_graphs_cuda.py tests/training/test_step_graphs.py \
    2>&1 | tee "$OUT/pytest.log" | tail -25
[ "${AB_S:-40}" = 0 ] || timeout "${AB_S:-40}" python3 bench/gpu_kernels_ab.py --only "${AB_ONLY:-fp32 weights,LoRA update,joined read}" \
    --out "$OUT/gpu_kernels_ab.md" 2>&1 | tee "$OUT/gpu_kernels_ab.log" | tail -12
[ "${TRIALS_S:-200}" = 0 ] || timeout "${TRIALS_S:-200}" python3 bench/trial_throughput.py --paths new,cudagraphs --workers 1 --configs "${TRIAL_CONFIGS:-lora,compacter_pp,parallel_adapter,bitfit,unipelt_apl}" \
    --seeds 1 --model /tmp/minilm --data-dir .gpu/glue --out "$OUT/trial_throughput_gpu.md" 2>&1 | tee "$OUT/trials.log" | tail -30
[ "${STEPS_S:-270}" = 0 ] || timeout "${STEPS_S:-270}" python3 bench/step_time.py --device cuda --batch 32 --steps 20 \
    --warmup 8 --graphs --out "$OUT/step_time_graphs.md" --kernels "$OUT/kernels.md" 2>&1 | tee "$OUT/step_time.log" | tail -70
