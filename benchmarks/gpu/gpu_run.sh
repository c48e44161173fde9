#!/usr/bin/env bash
# The whole check on a lent GPU machine in one command of at most 6 minutes: the tests that carry the gpu
# mark, then the GPU benchmark (BERT-base-shaped random Aggretriever, 1M x 768 rows generated on the
# machine, a 1M-document service), each step under its own time limit so that one slow step still leaves
# the others' results. Writes into OUT_DIR: pytest-gpu.log and .xml, bench-STEP.json and .log per step,
# first-stage-parts.json, and gpu-DEVICE.json and .md (every figure with its target; benchmarks/gpu/results.py).
#
#   usage: bash benchmarks/gpu/gpu_run.sh OUT_DIR
#   there: ../shared/gpu/pack.sh . here, then on the machine (carrying .gpu):
#          bash .gpu/run.sh bash benchmarks/gpu/gpu_run.sh "$OUT"
#   DENSEHYBRID_GPU_REHEARSAL=1 runs the same steps on the CPU at tiny sizes (tests/test_gpu_run.py).
set -uo pipefail
out="${1:?usage: bash benchmarks/gpu/gpu_run.sh OUT_DIR}"
mkdir -p "$out"
if [ "${DENSEHYBRID_GPU_REHEARSAL:-0}" = 1 ]; then
  preset=gpu-rehearsal; tests_s=300; search_s=120; encoder_s=120; service_s=180; parts_rows=20000
else
  preset=gpu; tests_s=90; search_s=60; encoder_s=60; service_s=150; parts_rows=1000000
fi
status=0
started=$SECONDS

# shellcheck disable=SC2046  # one argument per test file
timeout "$tests_s" python -m pytest -q -m gpu -p no:cacheprovider --junitxml "$out/pytest-gpu.xml" \
  $(grep -l "mark.gpu" tests/test_*.py) > "$out/pytest-gpu.log" 2>&1 || status=1
echo "gpu tests ($((SECONDS - started)) s): $(tail -n 1 "$out/pytest-gpu.log")"

step() {  # step NAME SECONDS SECTION... : one benchmark run of those sections
  local name=$1 limit=$2; shift 2
  local sections=() s
  for s in "$@"; do sections+=(--only "$s"); done
  local begun=$SECONDS
  if timeout "$limit" python -m densehybrid.bench --preset "$preset" "${sections[@]}" \
       --out "$out/bench-$name.json" > "$out/bench-$name.log" 2>&1; then
    echo "bench $name: done in $((SECONDS - begun)) s"
  else
    echo "bench $name: FAILED or cut at ${limit} s (see $out/bench-$name.log)"; status=1
  fi
}
step search "$search_s" memory search
step encoder "$encoder_s" encoder
# the service step also samples the server's threads under the highest load (py-spy, when packed)
DENSEHYBRID_BENCH_PROFILE_DIR="$out/profile" step service "$service_s" service
# where the first stage's time goes (matmul forms, top-k, a copy of the rows), beside the benchmark
timeout 60 python -m densehybrid.bench.parts.first_stage "" "$parts_rows" > "$out/first-stage-parts.json" \
  2> "$out/first-stage-parts.log" || { echo "first-stage parts: FAILED (see $out/first-stage-parts.log)"; status=1; }

python -m densehybrid.bench.gpu.results "$out" > "$out/summary.txt" 2>&1 || status=1
cat "$out/summary.txt"
echo "gpu_run: $((SECONDS - started)) s in all, status $status"
exit "$status"
