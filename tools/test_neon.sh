#!/usr/bin/env bash
# The NEON kernels' property tests (tests/kernels_prop.rs, the attention
# kernels' in tests/attention_kernels.rs, the ggml block kernels' in
# tests/ggml_kernels.rs) on aarch64, run
# under qemu-user: cross-compiles with Debian's aarch64 gcc as the linker.
# Installs what it needs (rustup target, gcc-aarch64-linux-gnu, qemu-user);
# where that is impossible it says so and exits 0 without testing, so a
# machine without package access skips the check instead of failing it.
set -euo pipefail
cd "$(dirname "$0")/.."

skip() {
  echo "NEON check skipped: $1" >&2
  exit 0
}

target=aarch64-unknown-linux-gnu
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  rustup target add "$target" || skip "cannot install the $target standard library"
fi

if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || skip "no apt-get to install gcc-aarch64-linux-gnu and qemu-user"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || skip "not root and no sudo to install packages"
    sudo_cmd="sudo"
  fi
  pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
  $sudo_cmd apt-get install -y -qq "${pkgs[@]}" >/dev/null 2>&1 \
    || { $sudo_cmd apt-get update -qq >/dev/null 2>&1 && $sudo_cmd apt-get install -y -qq "${pkgs[@]}" >/dev/null 2>&1; } \
    || skip "cannot install ${pkgs[*]}"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo test --release --target "$target" -p colibri --test kernels_prop
cargo test --release --target "$target" -p colibri --test attention_kernels
cargo test --release --target "$target" -p colibri --test ggml_kernels
