#!/bin/sh
# One-shot setup for the Compose stack (service "setup", profile "setup"):
# fetch the named offline models into the cache volume, build the index into the
# index volume unless a finished one is already there, then export the ONNX
# graphs the replicas run on the CPU into the cache volume.
#
# Index builds publish by renaming a finished temporary directory, so an
# existing $DENSEHYBRID_INDEX is always a complete index; to rebuild, point
# DENSEHYBRID_INDEX at a new name (or remove the volume).
set -eu

# A failed setup is loud: one line naming the step, on stderr, and a non-zero exit, which
# `docker compose up` reports as its own failure. An index is published by a rename only once
# built, so a failed build leaves none: the replicas refuse to start on it, never healthy.
step="checking the settings"
report_failure() {
    code=$?
    if [ "$code" -ne 0 ]; then
        echo "setup: FAILED (exit $code) while $step (the error is above)" >&2
    fi
}
trap report_failure EXIT

: "${DENSEHYBRID_INDEX:?DENSEHYBRID_INDEX must name the index directory}"
: "${DENSEHYBRID_MODEL:?DENSEHYBRID_MODEL must name the model (zoo name, path or hub id)}"
: "${DENSEHYBRID_CORPUS:?DENSEHYBRID_CORPUS must name the corpus.jsonl to index}"

if [ -n "${DENSEHYBRID_FETCH_MODELS:-}" ]; then
    step="fetching the models $DENSEHYBRID_FETCH_MODELS"
    # shellcheck disable=SC2086  # a space-separated list of zoo names
    densehybrid models fetch $DENSEHYBRID_FETCH_MODELS
fi

if [ -d "$DENSEHYBRID_INDEX" ]; then
    echo "setup: index $DENSEHYBRID_INDEX exists; not rebuilding"
else
    step="building the index $DENSEHYBRID_INDEX from $DENSEHYBRID_CORPUS"
    if [ ! -f "$DENSEHYBRID_CORPUS" ]; then
        echo "setup: corpus $DENSEHYBRID_CORPUS not found (mount it with DENSEHYBRID_CORPUS_DIR)" >&2
        exit 1
    fi
    densehybrid index build --model "$DENSEHYBRID_MODEL" --corpus "$DENSEHYBRID_CORPUS" --out "$DENSEHYBRID_INDEX"
fi

# The replicas mount the cache read-only: the ONNX graphs their CPU backend runs (serve --backend auto)
# are exported here, once (a no-op when already there; unused on a GPU, where they run torch).
# Not exec'd: the trap above reports a failure of this step too.
step="exporting the ONNX graphs of $DENSEHYBRID_INDEX"
densehybrid models export-onnx --index "$DENSEHYBRID_INDEX"
