#!/bin/sh
# Generate the Compose stack's secrets once, before the first `docker compose up`:
#
#   deploy/init-env.sh [ENV_FILE]     (default: .env beside docker-compose.yml)
#
# Writes DENSEHYBRID_API_KEY and GRAFANA_ADMIN_PASSWORD (random, 256 bits each)
# into ENV_FILE, which Compose reads on its own. The file is git-ignored, kept
# out of the image build context, and readable by its owner only (0600).
# Values already in the file are kept, so running it again changes nothing;
# the file is replaced by a rename, so a crash never leaves half of it.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
env_file=${1:-$here/.env}

random_secret() {
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n'
}

has_value() {
    [ -f "$env_file" ] && grep -Eq "^$1=.+" "$env_file"
}

umask 077
staged=$(mktemp "$env_file.XXXXXX")
trap 'rm -f "$staged"' EXIT
if [ -f "$env_file" ]; then
    # drop empty assignments of the names filled in below; keep everything else
    grep -Ev '^(DENSEHYBRID_API_KEY|GRAFANA_ADMIN_PASSWORD)=$' "$env_file" >"$staged" || true
fi
added=""
for name in DENSEHYBRID_API_KEY GRAFANA_ADMIN_PASSWORD; do
    if ! has_value "$name"; then
        printf '%s=%s\n' "$name" "$(random_secret)" >>"$staged"
        added="$added $name"
    fi
done
chmod 600 "$staged"
mv "$staged" "$env_file"
trap - EXIT
if [ -n "$added" ]; then
    echo "init-env: wrote$added to $env_file (mode 0600)"
else
    echo "init-env: $env_file already holds both secrets; kept them"
fi
