#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian machine: system packages, then a virtual
# environment in .venv with the project and its test tools installed in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."

# dataset-fashion-mnist: the default data; chromium: the report's browser test; postgresql: the
# ledger's PostgreSQL test; the fonts: the glyphs dataset (pate/data/glyphs.py).
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
pip=(.venv/bin/python -m pip install -q --no-cache-dir)
"${pip[@]}" --upgrade pip

# PyTorch. With an NVIDIA GPU: the registry's CUDA build, and torchvision (the datasets extra).
# Without one: the CPU build (a 1.7 GB .venv in all, against 6.2 GB with the CUDA build) from
# PyTorch's CPU index, or offline from the wheels in $PIP_FIND_LINKS; the config files are skipped
# so that no other index offers a CUDA build. torchvision stays out there: the registry's build
# wants the CUDA torch, and pate needs it only to download MNIST, Fashion-MNIST, SVHN or CIFAR-10
# and to read the last two (pate/data/datasets.py). If no CPU build can be had, the next step takes the
# registry's torch.
extras=test
if command -v nvidia-smi >/dev/null 2>&1; then
  extras=test,datasets
elif ! .venv/bin/python -c "import torch" 2>/dev/null; then
  PIP_CONFIG_FILE=/dev/null "${pip[@]}" --no-deps --retries 0 \
    --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null \
    || echo "setup: no CPU build of torch found; installing the registry's build" >&2
fi
"${pip[@]}" -e ".[$extras]"
