#!/usr/bin/env bash
# The whole GPU validation in one go, for a machine with an NVIDIA GPU:
# the GPU tests, compute-sanitizer on one full invocation, differential checks
# against the CPU oracle, and the benchmark tables.
#   bash tools/gpu_validation.sh OUTDIR
# Uses the python3 on PATH with PYTHONPATH=src (no install needed).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
bob() { python3 -m bob "$@"; }
status=0
step() { echo; echo "== $*"; }

step "doctor"
bob doctor || status=1

step "GPU tests (pytest -m gpu)"
python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -25 || status=1

step "compute-sanitizer memcheck: one full invocation on the cuda backend"
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m bob train --backend cuda --steps 20 -N 20 --overwrite \
    -c "$out/sanitized.safetensors" 2>&1 | grep -E "ERROR SUMMARY|error|loss \(nats\)" | head
  echo "compute-sanitizer exit: ${PIPESTATUS[0]}"
else
  echo "compute-sanitizer not found"
fi

step "differential checks against the CPU"
for args in "-V 256 --mode hard" "-V 256 --mode corpus" "-V 1024 --mode hard" \
            "-V 256 --mode hard --schedule fused" "-V 1024 --mode corpus --schedule fused"; do
  for pair in cpu,cuda cpu,nv; do
    echo "-- $pair $args"; bob check --backends "$pair" $args || status=1
  done
done
# nv reads a 1 GiB arena back through BAR1 slowly: V=8192 only against cuda here.
for args in "-V 8192 --mode corpus -N 2 --steps 4 -P 1" \
            "-V 8192 --mode hard -N 2 --steps 4 -P 1 --schedule fused"; do
  echo "-- cpu,cuda $args"; bob check --backends cpu,cuda $args || status=1
done

step "benchmarks"
bob bench --backend cuda --backend cpu --repeats 5 --save "$out/bench.json" || status=1
exit $status
