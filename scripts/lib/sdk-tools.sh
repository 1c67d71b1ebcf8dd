# The client libraries' tools (sourced by scripts/sdk-generate and scripts/sdk-test): a Python
# venv with sdk/python/requirements-dev.txt (the generator, pytest, build; pinned) and
# sdk/typescript's node_modules from its package-lock.json (npm ci). Each is redone only when
# its pins change. Node.js and npm come from Debian (installed with apt-get when missing).

SDK_VENV="${AGENTFLEET_SDK_VENV:-${CARGO_TARGET_DIR:-target}/sdk-venv}"
SDK_PY="$SDK_VENV/bin/python"

sdk_tools() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "sdk: installing nodejs and npm (apt-get)"
    local asudo=""; [[ $(id -u) -ne 0 ]] && asudo=sudo
    $asudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $asudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  local req=sdk/python/requirements-dev.txt stamp="$SDK_VENV/.installed-requirements"
  if ! cmp -s "$req" "$stamp" 2>/dev/null; then
    echo "sdk: python venv $SDK_VENV (pip, pinned)"
    if [[ ! -x "$SDK_PY" ]] && ! python3 -m venv "$SDK_VENV" 2>/dev/null; then
      # Debian ships venv apart from python3.
      local sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
      rm -rf "$SDK_VENV"
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      python3 -m venv "$SDK_VENV"
    fi
    "$SDK_PY" -m pip install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
  fi
  local lock=sdk/typescript/package-lock.json nstamp=sdk/typescript/node_modules/.installed-lock
  if ! cmp -s "$lock" "$nstamp" 2>/dev/null; then
    echo "sdk: npm ci (sdk/typescript)"
    (cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error)
    cp "$lock" "$nstamp"
  fi
}
