#!/usr/bin/env bash
# A change's effect on GPU step time, before and after on the same card in one call of the `device`
# tool: bench/step_time.py --graphs for some rows, first with the package as it was at a revision,
# then with the working tree's. Here, before the call:
#     rm -rf .old && mkdir .old && git archive REV petl_nas search_space | tar -x -C .old    (/.old/ in .git/info/exclude)
# then carry .old and .whl (optuna: bench/gpu_carry.sh) and run, there:
#     ONLY=lora,lora_ffn bash bench/gpu_step_ab.sh
# The script's folder comes first on Python's path, then PYTHONPATH: .old's petl_nas is imported for
# the "before" run, the working tree's for "after". Each run has its own floor, so compare ratios
# (× graphed floor), not milliseconds across runs; the tables land in $OUT as step_before.md and
# step_after.md, both runs' output in step_ab.log.
set -u
OUT=${OUT:-/tmp/gpu_step_ab_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
for side in before after; do
    tree=$PWD; [ "$side" = before ] && tree=$PWD/.old
    [ -d "$tree/petl_nas" ] || { echo "gpu_step_ab: no $tree/petl_nas (see the top of this script)"; exit 1; }
    echo "== $side: $tree/petl_nas" | tee -a "$OUT/step_ab.log"
    PYTHONPATH=/tmp/site:$tree timeout "${STEP_S:-90}" python3 bench/step_time.py --device cuda --batch 32 \
        --steps "${STEPS:-20}" --warmup 8 --graphs --only "${ONLY:-lora,lora_ffn}" --out "$OUT/step_$side.md" \
        2>&1 | grep -v Warning | tee -a "$OUT/step_ab.log" | grep -E "^\| (frozen|[a-z_]+ \| (petl-nas|peft))" | tail -8
done
