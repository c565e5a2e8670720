#!/usr/bin/env bash
# Debian packages that tests drive for real, installed when missing (needs root or passwordless sudo):
#   postgresql   the team collector's PostgreSQL store (tests/unit/feedback/test_collector_postgres.py)
#   chromium     the HTML feedback report rendered headless (the VS Code e2e script installs it too)
#   gcc          builds the fused CPU decoding step (kernels/cpu_decode.c; usually present already)
#   bubblewrap   contains the workspace's tests the agent runs (agent/contain.py; `unshare` otherwise)
#   cmake, g++   build llama.cpp's server for the completion-server tests (.ci/install-llama-server.sh)
# Without them those tests are skipped and say why; nothing else depends on them.
set -euo pipefail
PACKAGES=(postgresql chromium gcc bubblewrap cmake g++)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
command -v apt-get >/dev/null || { echo "system-packages: no apt-get; skipping ${missing[*]}" >&2; exit 1; }
sudo=()
[ "$(id -u)" -ne 0 ] && sudo=(sudo -n)
echo "system-packages: apt-get install ${missing[*]}" >&2
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
  --no-install-recommends "${missing[@]}" >/dev/null
