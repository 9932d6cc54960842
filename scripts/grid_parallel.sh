#!/usr/bin/env bash
# The model grid (configs/models.toml's llama-step candidates and timing) split over the GPUs of one
# host: one job per GPU, each its own models, candidates interleaved within each model as the suite
# does; every job leaves its evidence under $OUT/gpuK/.
#
#   scripts/grid_parallel.sh "llama-7m llama-3-8b-layer2" "smollm-135m-layer4 qwen2.5-1.5b-layer4" ...
set -uo pipefail
OUT=${OUT:-/tmp/kb-out}
# The suite's candidates, modes and timing, read from the suite itself.
SUITE_ARGS=$(python3 -c '
import tomllib
suite = tomllib.load(open("configs/models.toml", "rb"))
bench, s = suite["bench"][0], suite["suite"]
args = [bench["op"], "--warmup-ms", s["warmup_ms"], "--rep-ms", s["rep_ms"], "--rounds", s["rounds"]]
args += [x for m in bench["modes"] for x in ("-m", m)] + [x for c in bench["candidates"] for x in ("-c", c)]
print(" ".join(map(str, args)))')
gpu=0
for models in "$@"; do
  args="run $SUITE_ARGS"
  for m in $models; do args="$args -w $m"; done
  CUDA_VISIBLE_DEVICES=$gpu KB_WORK=/tmp/kbgrid$gpu OUT=$OUT/gpu$gpu scripts/gpu_run.sh "kb:$args" > "$OUT/gpu$gpu.log" 2>&1 &
  gpu=$((gpu + 1))
done
wait
tail -n 40 "$OUT"/gpu*.log
