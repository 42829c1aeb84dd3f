#!/usr/bin/env bash
# Installs the Debian packages Strata builds against (only the missing ones), on a fresh
# Debian 12 machine. Run as root or with sudo. See README.md, "Dependencies".
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev libspdlog-dev libyaml-cpp-dev libeigen3-dev nlohmann-json3-dev
  libdnnl-dev ocl-icd-opencl-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev liburing-dev libaio-dev
  fortunes-min fortunes fio
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
