#!/usr/bin/env bash
# The data the GPU run reads, packed small enough to travel with a call (at most 64 MiB each, the packed
# wheels included), into two git-ignored folders of the checkout:
#   .gpu-data     packages.jsonl.gz (every eighth package summary), msmarco.jsonl.gz (the MS MARCO passages)
#                 and queries.jsonl (the package queries, for the live step): about 5 MB, carried with .gpu
#   .gpu-minilm   MiniLM's model directory with its weights in float16 (45 MB): too large to travel beside
#                 .gpu, so the minilm step gets a call of its own on the still-warm machine
#
#   usage: bash benchmarks/gpu/pack_data.sh SHARED_DATA_DIR [MINILM_DIR]
#          (MINILM_DIR defaults to the model cache's minilm: `densehybrid models fetch minilm` first)
set -euo pipefail
data="${1:?usage: bash benchmarks/gpu/pack_data.sh SHARED_DATA_DIR [MINILM_DIR]}"
minilm="${2:-${DENSEHYBRID_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/densehybrid}/models/minilm}"
root="$(git rev-parse --show-toplevel)"
mkdir -p "$root/.git/info"
for folder in /.gpu-data/ /.gpu-minilm/; do
  grep -qxF "$folder" "$root/.git/info/exclude" 2>/dev/null || echo "$folder" >> "$root/.git/info/exclude"
done

rm -rf "$root/.gpu-data" && mkdir -p "$root/.gpu-data"
gzip -dc "$data/packages/corpus.jsonl.gz" | awk 'NR % 8 == 1' | gzip -6 > "$root/.gpu-data/packages.jsonl.gz"
gzip -6 -c "$data/msmarco-dl-5k/corpus.jsonl" > "$root/.gpu-data/msmarco.jsonl.gz"
cp "$data/packages/queries-dev.jsonl" "$root/.gpu-data/queries.jsonl"

rm -rf "$root/.gpu-minilm" && cp -r "$minilm" "$root/.gpu-minilm"
python - "$root/.gpu-minilm/model.safetensors" <<'PY'
import sys

from safetensors.torch import load_file, save_file

weights = load_file(sys.argv[1])
save_file({name: t.half() if t.is_floating_point() else t for name, t in weights.items()}, sys.argv[1],
          metadata={"format": "pt"})
PY
du -sh "$root/.gpu-data" "$root/.gpu-minilm"
