# densehybrid images (BuildKit, the default builder since Docker 23):
#   GPU (default): docker build -t densehybrid:gpu .
#   CPU only:      docker build --build-arg VARIANT=cpu -t densehybrid:cpu .
# Both install with deploy/install.sh, the same script tests/test_deploy_install.py
# runs in a fresh venv. See docs/deploy.md.
#
# No "# syntax=" line: that makes BuildKit fetch its frontend image from a registry,
# which fails offline; the built-in frontend handles RUN --mount and COPY --chmod.
# The base images and torch indexes below are build arguments (Compose passes them
# from DENSEHYBRID_PYTHON_IMAGE, DENSEHYBRID_CUDA_IMAGE, DENSEHYBRID_TORCH_INDEX_URL_*).

# VARIANT picks the base of both the build and the runtime stage, so the venv is
# built against the same interpreter it runs on.
ARG VARIANT=gpu
# CUDA 13.0 runtime with cuDNN 9: PyPI's onnxruntime-gpu (1.31) is a CUDA 13 build and needs cuDNN;
# torch's cu130 wheels bring their own CUDA libraries and carry sm_90 (Hopper) and newer kernels.
# The GPU first stage is torch, not Faiss (the faiss-gpu-cu12 wheels have no sm_90 code).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
# Where each variant's torch comes from. PyPI's Linux torch wheel is the CUDA
# build (GBs of CUDA libraries): the CPU image takes the PyTorch CPU index; the
# GPU image the CUDA 13.0 one, matching its base. Override for a mirror.
ARG TORCH_INDEX_URL_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_URL_GPU=https://download.pytorch.org/whl/cu130

FROM ${PYTHON_IMAGE} AS base-cpu

FROM ${CUDA_IMAGE} AS base-gpu
# Ubuntu 24.04's python3 is 3.12; ca-certificates for `models fetch` over HTTPS.
# Versions float with the base image's security updates, hence no pins.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build stage
# hadolint ignore=DL3006
FROM base-${VARIANT} AS build
ARG VARIANT
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL_CPU
ARG TORCH_INDEX_URL_GPU
WORKDIR /src
COPY deploy/install.sh deploy/install.sh
COPY pyproject.toml README.md ./
COPY package package
COPY cli cli
COPY encoder encoder
COPY index index
COPY service service
COPY benchmarks benchmarks
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ "${VARIANT}" = cpu ]; then TORCH_INDEX_URL="${TORCH_INDEX_URL_CPU}"; else TORCH_INDEX_URL="${TORCH_INDEX_URL_GPU}"; fi \
    && export TORCH_INDEX_URL TORCH_VERSION \
    && sh deploy/install.sh "${VARIANT}" /opt/venv /src

# -------------------------------------------------------------- runtime stage
# Only the venv comes over: no sources, compilers or pip caches.
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
ARG VARIANT
LABEL org.opencontainers.image.title="densehybrid" \
      org.opencontainers.image.description="Online retrieval service for Aggretriever, DHR and [CLS] retrievers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.densehybrid.variant="${VARIANT}"

# Fixed ids so volume ownership is predictable across rebuilds and hosts.
RUN groupadd --system --gid 10001 densehybrid \
    && useradd --system --uid 10001 --gid densehybrid --home-dir /home/densehybrid --create-home \
       --shell /usr/sbin/nologin densehybrid \
    && mkdir -p /var/cache/densehybrid /data/indexes \
    && chown densehybrid:densehybrid /var/cache/densehybrid /data/indexes

COPY --from=build /opt/venv /opt/venv
COPY --chmod=0755 deploy/healthcheck.py /usr/local/bin/densehybrid-healthcheck
COPY --chmod=0755 deploy/setup.sh /usr/local/bin/densehybrid-setup

# DENSEHYBRID_INDEX is a directory *inside* the volume: index builds publish by
# renaming a temporary sibling, and a rename cannot replace a mount point.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DENSEHYBRID_CACHE_DIR=/var/cache/densehybrid \
    HF_HOME=/var/cache/densehybrid/huggingface \
    DENSEHYBRID_INDEX=/data/indexes/default \
    DENSEHYBRID_HOST=0.0.0.0 \
    DENSEHYBRID_PORT=8000

# Named volumes start as copies of these directories, owned by densehybrid.
VOLUME ["/var/cache/densehybrid", "/data/indexes"]
USER 10001:10001
WORKDIR /home/densehybrid
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["densehybrid-healthcheck", "/health"]

# Exec form: the server is PID 1 and receives SIGTERM itself; uvicorn then stops
# accepting, lets in-flight requests finish and exits 0 (tests/test_deploy_sigterm.py).
STOPSIGNAL SIGTERM
ENTRYPOINT ["densehybrid"]
CMD ["serve"]
