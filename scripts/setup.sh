#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian machine: system packages, then a virtual
# environment in .venv with the project and its test tools installed in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."

# dataset-fashion-mnist: the default data; chromium: the report's browser test; postgresql: the
# ledger's PostgreSQL test; the fonts: the glyphs dataset (pate/glyphs.py).
apt_packages=(dataset-fashion-mnist chromium postgresql fonts-dejavu-core fonts-liberation2
              fonts-freefont-ttf fonts-urw-base35 fonts-texgyre fonts-croscore)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
