#!/usr/bin/env bash
# Installs what the real-VS-Code test (tests/e2e/test_vscode.py) needs, once per machine:
#   - Debian packages: chromium (driven by Playwright), ripgrep (VS Code's search), and the headers
#     that code-server's native modules build against;
#   - code-server (VS Code in a browser) from the npm registry, built from source with none of its
#     postinstall downloads (they reach outside the package registries, and refuse to run as root);
#   - the extension's own node_modules (`npm ci`: TypeScript, esbuild, vsce, playwright-core).
# Everything comes from the Debian mirror and the npm registry. The result is cached under
# $SQUIDCODE_E2E_DIR (default ~/.cache/squidcode/vscode-e2e); a second run with the stamp present
# returns at once. Prints the code-server binary's path on its last line.
set -euo pipefail

CODE_SERVER_VERSION=4.100.3   # VS Code 1.100; later releases need node 22+
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${SQUIDCODE_E2E_DIR:-$HOME/.cache/squidcode/vscode-e2e}"
STAMP="$DEST/.installed-code-server-$CODE_SERVER_VERSION"
CS="$DEST/node_modules/code-server"
APT_PACKAGES=(chromium ripgrep libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev pkg-config
  build-essential python3)

say() { echo "install-e2e: $*" >&2; }

apt_install() {
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo -n)
  say "apt-get install ${missing[*]}"
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

extension_deps() {
  # The extension's own tools; the lockfile pins them.
  if [ ! -f "$HERE/node_modules/.package-lock.json" ] || \
     [ "$HERE/package-lock.json" -nt "$HERE/node_modules/.package-lock.json" ]; then
    say "npm ci in $HERE"
    (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

code_server() {
  [ -f "$STAMP" ] && return
  say "code-server $CODE_SERVER_VERSION into $DEST (native modules build from source: a few minutes)"
  rm -rf "$DEST" && mkdir -p "$DEST"
  cd "$DEST"
  echo '{"name": "squidcode-vscode-e2e", "private": true}' > package.json
  # Headers from the installed node (no download from nodejs.org); node-gyp from the registry.
  export npm_config_nodedir="${npm_config_nodedir:-$(dirname "$(dirname "$(command -v node)")")}"
  export npm_config_yes=true npm_config_audit=false npm_config_fund=false npm_config_loglevel=error
  npm install --ignore-scripts "code-server@$CODE_SERVER_VERSION" node-gyp@12.4.0
  export npm_config_node_gyp="$DEST/node_modules/node-gyp/bin/node-gyp.js"
  (
    cd "$CS/lib/vscode"
    npm install --ignore-scripts --omit=dev
    # @vscode/ripgrep's postinstall downloads rg unless bin/ exists: use Debian's.
    mkdir -p node_modules/@vscode/ripgrep/bin
    ln -sfn "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
    npm rebuild
    ln -sfn node_modules node_modules.asar
    (cd bin/remote-cli && ln -sf code-linux.sh code-server)
    (cd bin/helpers && ln -sf browser-linux.sh browser.sh)
    (cd extensions && npm install --omit=dev)
  )
  npm rebuild argon2
  "$CS/out/node/entry.js" --version >/dev/null 2>&1 || node "$CS/out/node/entry.js" --version >&2
  touch "$STAMP"
}

check_node() {
  command -v node >/dev/null && command -v npm >/dev/null || {
    say "needs node 20+ and npm on PATH (code-server $CODE_SERVER_VERSION is built for node 20)"; exit 1; }
  local major
  major="$(node -p 'process.versions.node.split(".")[0]')"
  [ "$major" -ge 20 ] || { say "node $(node --version) is too old: code-server $CODE_SERVER_VERSION needs node 20"; exit 1; }
}

start=$(date +%s)
check_node
apt_install
code_server
extension_deps
say "ready in $(( $(date +%s) - start )) s"
echo "$DEST/node_modules/.bin/code-server"
