#!/usr/bin/env bash
# Installs the Debian 12 packages Kestrel builds and tests with, and the Node packages of the OpenAI SDK test
# (tests/daemon/integration/openai_sdk, from its committed package-lock.json with npm ci). Idempotent: installs only
# what is missing. Run as root (or with sudo available). CUDA is not installed here: gpu/ builds when nvcc is present.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git python3
  clang clang-format clang-tidy libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libfmt-dev libspdlog-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libboost-dev libsystemd-dev libedit-dev
  python3-grpcio python3-grpc-tools python3-numpy
  curl
)
# Node.js for the OpenAI SDK test: Debian's nodejs and npm unless a node (e.g. NodeSource's, which bundles npm) is
# already installed.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all ${#packages[@]} packages present"
else
  echo "setup-debian: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The OpenAI Node SDK, exactly as pinned in the lockfile; again only when the lockfile changed since the last install.
sdk=tests/daemon/integration/openai_sdk
if [ ! -f "$sdk/node_modules/.package-lock.json" ] || [ "$sdk/package-lock.json" -nt "$sdk/node_modules/.package-lock.json" ]; then
  echo "setup-debian: npm ci in $sdk"
  npm ci --prefix "$sdk" --no-audit --no-fund --loglevel=error
else
  echo "setup-debian: $sdk/node_modules is up to date"
fi
