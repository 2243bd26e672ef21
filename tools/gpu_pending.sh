#!/usr/bin/env bash
# The GPU checks and benches of the collapsed tables and Bob's own kernels, most needed
# first, each step under its own time limit, within one 30-minute device session:
#   bash tools/gpu_pending.sh OUTDIR [STEP...]
# the collapsed tables on cuda and nv against the CPU (smoke tier, then past the dense
# tables), Bob's own kernels alone against NVRTC's and the reference in both orderings and
# their timing, a run with no CUDA wheel (nv on Bob's own code) against cuda's bytes, then
# the collapsed and the huge-vocabulary benchmarks (BOB_VARIANTS: saved own builds timed
# side by side, dev/bringup/own_variants.py). Every step's output is
# OUTDIR/<step>.log; a summary last.
# STEPs name the steps to run (all where none is named), so that they can be spread over
# several device calls of at most 10 minutes each. BOB_TOKENS names a directory holding a
# token corpus (train.bin, val.bin) for bench-collapsed, copied rather than made again.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out}
shift || true
wanted=" $* "
mkdir -p "$out"
export PYTHONPATH=src:.:tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
summary=()
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  if [ "$wanted" != "  " ] && [[ "$wanted" != *" $name "* ]]; then return; fi
  echo "== $name (at most ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -5 "$out/$name.log"
  summary+=("$name: exit $rc after $((SECONDS - start))s")
}

step doctor 60 python3 -m bob doctor
step collapsed-smoke 300 python3 -m pytest -q -s -m "gpu and smoke" -p no:cacheprovider \
  tests/test_collapsed_gpu.py
step collapsed-past-dense 300 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
  tests/test_collapsed_gpu.py -k past_the_dense_tables
# Every own region alone, a step a vocabulary (both orderings): on an H100 V = 256 takes
# about 110 s, V = 300 about 200, the larger ones longer (own-alone-V; own-alone: all).
alone="tests/test_own_kernels_gpu.py::test_each_own_region_alone_leaves_nvrtc_s_and_the_reference_s_bytes"
if [[ "$wanted" == *" own-alone "* ]]; then
  wanted="$wanted own-alone-256 own-alone-300 own-alone-2053 own-alone-8192 "
fi
for vocab in 256 300 2053 8192; do
  step "own-alone-$vocab" 500 python3 -m pytest -q -s -m gpu -p no:cacheprovider "$alone" \
    -k "$vocab"
done
step own-timing 400 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
  "tests/test_own_kernels_gpu.py::test_own_kernels_time_beside_nvrtc_s"
# Saved builds of the own images (dev/bringup/own_variants.py save LABEL DIR, one a commit)
# timed side by side against NVRTC's, where BOB_VARIANTS names their directory (every
# build in it) or the builds' files, separated by spaces.
if [ -n "${BOB_VARIANTS:-}" ]; then
  if [ -d "$BOB_VARIANTS" ]; then builds=("$BOB_VARIANTS"/*.pickle)
  else read -ra builds <<<"$BOB_VARIANTS"; fi
  step own-variants 300 python3 -m dev.bringup.own_variants time "${builds[@]}"
fi

# nv with no CUDA wheel against cuda: the same checkpoint bytes on the built-in corpus
# (V = 256), both schedules (the fused one is Bob's resident kernel there), with
# validation; then eval and generate on nv with no wheel against cuda's output; then, where
# BOB_TOKENS names a token corpus, a token vocabulary (its collapsed tables, seed schedule).
no_wheels() {
  local ok=0 nowheel="python3 -m dev.bringup.no_wheels"
  same() {  # same WHAT FILE_A FILE_B
    if [ ! -s "$2" ] || [ ! -s "$3" ]; then echo "no-wheels $1: NOT WRITTEN"; ok=1
    elif cmp -s "$2" "$3"; then echo "no-wheels $1: the same bytes as cuda"
    else echo "no-wheels $1: DIFFERENT from cuda"; ok=1; fi
  }
  for schedule in seed fused; do
    python3 -m bob train --backend cuda --schedule "$schedule" --steps 20 -N 10 \
      --val-text README.md --overwrite -c "$out/cuda-$schedule.safetensors" || ok=1
    $nowheel train --backend nv --schedule "$schedule" --steps 20 -N 10 \
      --val-text README.md --overwrite -c "$out/nv-own-$schedule.safetensors" || ok=1
    same "train $schedule" "$out/cuda-$schedule.safetensors" "$out/nv-own-$schedule.safetensors"
  done
  python3 -m bob eval --backend cuda --text README.md -c "$out/cuda-seed.safetensors" \
    --json > "$out/eval-cuda.json" || ok=1
  $nowheel eval --backend nv --text README.md -c "$out/cuda-seed.safetensors" --json \
    > "$out/eval-nv.json" || ok=1
  same eval "$out/eval-cuda.json" "$out/eval-nv.json"
  python3 -m bob generate --backend cuda -c "$out/cuda-seed.safetensors" -t 0 -n 200 \
    -p "The " > "$out/generate-cuda.txt" || ok=1
  $nowheel generate --backend nv -c "$out/cuda-seed.safetensors" -t 0 -n 200 -p "The " \
    > "$out/generate-nv.txt" || ok=1
  same "generate" "$out/generate-cuda.txt" "$out/generate-nv.txt"
  if [ -n "${BOB_TOKENS:-}" ]; then
    for backend in cuda nv; do
      local run="python3 -m bob"; [ $backend = nv ] && run=$nowheel
      $run count --tokens "$BOB_TOKENS/train.bin" -V 50257 -o "$out/counts-$backend.bob" || ok=1
      $run train --backend $backend --tokens "$BOB_TOKENS/train.bin" -V 50257 \
        --val-tokens "$BOB_TOKENS/val.bin" --schedule seed --steps 30 -N 10 --overwrite \
        -c "$out/tok-$backend.safetensors" || ok=1
      $run generate --backend $backend -c "$out/tok-$backend.safetensors" --ids "464 3290" \
        -t 0 -n 50 > "$out/tok-generate-$backend.txt" || ok=1
    done
    same "count (tokens)" "$out/counts-cuda.bob" "$out/counts-nv.bob"
    same "train (tokens, collapsed)" "$out/tok-cuda.safetensors" "$out/tok-nv.safetensors"
    same "generate (tokens)" "$out/tok-generate-cuda.txt" "$out/tok-generate-nv.txt"
  fi
  return $ok
}
export out PYTHONPATH
export -f no_wheels
step no-wheels 420 bash -c no_wheels

if [ -n "${BOB_TOKENS:-}" ]; then mkdir -p /tmp/bob-tok && cp "$BOB_TOKENS"/*.bin /tmp/bob-tok/; fi
step bench-collapsed 420 python3 -m dev.bench.bench_collapsed /tmp/bob-tok --steps 1000 \
  --torch-steps 30 --json "$out/bench-collapsed.json"
# Where the collapsed corpus update's time goes: Nsight Compute's reading of the fused
# kernel's first launch on the token corpus (100 updates).
step ncu-collapsed 180 ncu -k regex:bob_collapsed_fused_train_corpus -c 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats python3 -m dev.bench.bench_collapsed /tmp/bob-tok --backends cuda \
  --schedules fused --skip-job --skip-dense --skip-torch --steps 10
step bench-huge 480 python3 -m dev.bench.bench_huge /tmp/bob-huge --json "$out/bench-huge.json"
rm -rf /tmp/bob-tok /tmp/bob-huge "$out"/*.safetensors "$out"/*.bob

echo; echo "== summary"; printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
