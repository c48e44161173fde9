#!/bin/sh
# Install densehybrid into a fresh virtual environment: the one install recipe
# shared by the Dockerfile (both images) and tests/test_deploy_install.py.
#
#   deploy/install.sh VARIANT VENV SRC
#     VARIANT  cpu | gpu
#     VENV     where to create the virtual environment (e.g. /opt/venv)
#     SRC      the project source tree (holds pyproject.toml)
#
# Environment:
#   PYTHON           interpreter that creates the venv (default: python3)
#   TORCH_VERSION    torch release to pin (default: 2.13.0)
#   TORCH_INDEX_URL  index that serves the right torch build, e.g.
#                    https://download.pytorch.org/whl/cpu   (CPU-only wheels)
#                    https://download.pytorch.org/whl/cu130 (CUDA 13.0 wheels)
#                    Empty: pip's configured index. On PyPI the Linux x86_64
#                    torch wheel is the CUDA build, so an empty value is only
#                    right where that index already serves the build you want.
#
# torch goes in first and pinned: the project only asks for torch>=2.2, so pip
# keeps the build installed here instead of pulling PyPI's multi-GB CUDA one.
set -eu

if [ "$#" -ne 3 ]; then
    echo "usage: $0 cpu|gpu VENV SRC" >&2
    exit 2
fi
variant=$1
venv=$2
src=$3
case "$variant" in
    cpu | gpu) ;;
    *) echo "$0: VARIANT must be cpu or gpu, not '$variant'" >&2; exit 2 ;;
esac

"${PYTHON:-python3}" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

pip install --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    pip install --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION:-2.13.0}"
else
    pip install "torch==${TORCH_VERSION:-2.13.0}"
fi

# The [cpu] and [gpu] extras exclude each other (each brings its own onnxruntime build);
# [otel] lets the image send traces (DENSEHYBRID_OTLP_ENDPOINT).
# milvus: pymilvus, for `index export` and serving a collection (the Compose profile "milvus")
pip install "${src}[${variant},otel,milvus]"
"$venv/bin/python" -m pip check

# Fail the build, not the first request, if the wrong torch build slipped in.
"$venv/bin/python" - "$variant" <<'PY'
import sys

import faiss
import onnxruntime
import pymilvus
import torch

variant = sys.argv[1]
cuda = torch.version.cuda
if variant == "cpu" and cuda is not None:
    sys.exit(f"install.sh: the CPU image got a CUDA torch build ({torch.__version__}, CUDA {cuda})")
if variant == "gpu" and cuda is None:
    sys.exit(f"install.sh: the GPU image got a CPU-only torch build ({torch.__version__})")
print(f"install.sh: {variant}: torch {torch.__version__} (CUDA {cuda}), faiss {faiss.__version__}, "
      f"onnxruntime {onnxruntime.__version__} {onnxruntime.get_available_providers()}")
PY
"$venv/bin/densehybrid" --help >/dev/null
