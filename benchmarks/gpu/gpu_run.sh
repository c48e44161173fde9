#!/usr/bin/env bash
# The whole check on a lent GPU machine in one command, its steps in the order of what a lent machine is
# for, each under its own time limit and all under one deadline, so that a slow step still leaves the
# others' results:
#   tests   the tests that carry the gpu mark (pytest-gpu.log and .xml)
#   parts   where a 1M x 768 first stage's time goes, each top-k split timed (first-stage-parts.json)
#   scale   MS MARCO's 8.8M x 768 rows drawn on the device, served over HTTP (msmarco-scale.json)
#   live    the live recall's sampling on the device's first stage: its cost and its truth at 1M rows (live-recall.json)
#   corpus  real passages encoded by `index build` with the BERT-base Aggretriever shape (corpus-*.json)
#   minilm  the same with MiniLM, when its directory is there (DENSEHYBRID_GPU_MINILM)
#   search encoder service   the benchmark's sections at 1M rows (bench-STEP.json)
# then gpu-DEVICE.json and .md: every figure with its target (benchmarks/gpu/results.py).
#
#   usage: bash benchmarks/gpu/gpu_run.sh OUT_DIR [STEP...]      (default: every step, in the order above)
#   there: ../shared/gpu/pack.sh . here, then on the machine (carrying .gpu and the data folder):
#          bash .gpu/run.sh bash benchmarks/gpu/gpu_run.sh "$OUT"
#   DENSEHYBRID_GPU_DATA      folder with packages.jsonl.gz and msmarco.jsonl.gz for corpus/minilm, and
#                             queries.jsonl (BEIR queries) for live (.gpu-data)
#   DENSEHYBRID_GPU_MINILM    MiniLM's model directory for the minilm step (skipped when absent)
#   DENSEHYBRID_GPU_BUDGET_S  the deadline in seconds from the start (default 540)
#   DENSEHYBRID_GPU_REHEARSAL=1 runs the same steps on the CPU at tiny sizes (tests/test_gpu_run.py).
set -uo pipefail
out="${1:?usage: bash benchmarks/gpu/gpu_run.sh OUT_DIR [STEP...]}"
shift
steps="${*:-tests parts scale live corpus minilm search encoder service}"
mkdir -p "$out"
data="${DENSEHYBRID_GPU_DATA:-.gpu-data}"
minilm="${DENSEHYBRID_GPU_MINILM:-}"
if [ "${DENSEHYBRID_GPU_REHEARSAL:-0}" = 1 ]; then
  preset=gpu-rehearsal; device=cpu; parts_rows=20000; scale=(--rows 100000 --shape tiny --requests 64
  --concurrency 1 4 --client-processes 2); corpus_limit=300; shape=tiny
  live=(--rows 20000 --shape tiny --requests 16 --concurrency 1 --client-processes 1); live_queries=40
else
  preset=gpu; device=cuda; parts_rows=1000000; scale=(); corpus_limit=""; shape=bert-base
  live=(--rows 1000000 --requests 256 --concurrency 1 --client-processes 1); live_queries=1000
fi
status=0
started=$SECONDS
deadline=$((started + ${DENSEHYBRID_GPU_BUDGET_S:-540}))

run_step() {  # run_step NAME SECONDS COMMAND... : the command (or a function below) under min(SECONDS, time left)
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS - 10))  # 10 s kept for the summary
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then echo "$name: SKIPPED, the deadline is near"; status=1; return; fi
  local begun=$SECONDS
  if timeout "$limit" bash -c '"$@"' _ "$@" > "$out/$name.log" 2>&1; then
    echo "$name: done in $((SECONDS - begun)) s"
  else
    echo "$name: FAILED or cut at ${limit} s (see $out/$name.log)"; status=1
  fi
}
bench() {  # bench SECTION... : one run of the benchmark's sections
  local sections=() s
  for s in "$@"; do sections+=(--only "$s"); done
  python -m densehybrid.bench --preset "$preset" "${sections[@]}" --out "$out/bench-$1.json"
}
parts_to() {  # parts_to FILE : where the first stage's time goes, as JSON in FILE
  python -m densehybrid.bench.parts.first_stage "" "$parts_rows" > "$1"
}
encode_corpora() {  # encode_corpora LABEL MODEL-FLAGS... : each corpus in the data folder, through `index build`
  local label=$1 name file; shift
  for file in "$data"/*.jsonl.gz; do
    name="$(basename "$file" .jsonl.gz)"
    python -m densehybrid.bench.parts.corpus_encode "$file" "$out/corpus-$label-$name.json" --device "$device" \
      --label "$label $name" ${corpus_limit:+--limit "$corpus_limit"} "$@" || return 1
  done
}

export -f bench parts_to encode_corpora
export out preset data device corpus_limit parts_rows

for step in $steps; do
  case "$step" in
    tests)
      # shellcheck disable=SC2046  # one argument per test file
      run_step pytest-gpu 120 python -m pytest -q -m gpu -p no:cacheprovider --junitxml "$out/pytest-gpu.xml" \
        $(grep -l "mark.gpu" tests/test_*.py)
      echo "  $(tail -n 1 "$out/pytest-gpu.log")" ;;
    parts)
      run_step first-stage-parts 90 parts_to "$out/first-stage-parts.json" ;;
    scale)
      run_step msmarco-scale 300 python -m densehybrid.bench.scale.gpu "$out/msmarco-scale.json" --device "$device" \
        "${scale[@]}" ;;
    live)
      run_step live-recall 150 python -m densehybrid.bench.scale.gpu "$out/live-recall.json" --device "$device" \
        "${live[@]}" --live-recall "$data/queries.jsonl:$live_queries" ;;
    corpus)
      run_step corpus-aggretriever 150 encode_corpora aggretriever --random-shape "$shape" --kind aggretriever ;;
    minilm)
      if [ -n "$minilm" ] && [ -f "$minilm/config.json" ]; then
        run_step corpus-minilm 90 encode_corpora minilm --model "$minilm" --kind cls --pooling mean --normalize
      else
        echo "minilm: skipped (DENSEHYBRID_GPU_MINILM names no model directory)"
      fi ;;
    search) run_step bench-search 60 bench memory search ;;
    encoder) run_step bench-encoder 60 bench encoder ;;
    # the service step also samples the server's threads under the highest load (py-spy, when packed)
    service) DENSEHYBRID_BENCH_PROFILE_DIR="$out/profile" run_step bench-service 150 bench service ;;
    *) echo "unknown step $step (steps: tests parts scale live corpus minilm search encoder service)"; exit 2 ;;
  esac
done

python -m densehybrid.bench.gpu.results "$out" > "$out/summary.txt" 2>&1 || status=1
cat "$out/summary.txt"
echo "gpu_run: $((SECONDS - started)) s in all, status $status"
exit "$status"
