#!/usr/bin/env bash
# Runs the unit tests and tests/backend_reg.rs under ThreadSanitizer: the request slab, the FFI guard's
# live-object registry, the lock helpers and every test that drives one comm from several threads over
# the in-memory fabric (memfab). Installs nothing: needs `rustup toolchain install nightly --component
# rust-src` (std is rebuilt with -Zbuild-std so that its locks are instrumented too). Not part of CI
# (CI has no nightly). Builds into target-tsan/ (its own, the flags differ). Exits non-zero when a test
# fails or TSan reports a race (TSan's exit code 66).
#
# Usage: scripts/tsan.sh [libtest args, e.g. a module path: plugin::slab]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_TSAN:-$PWD/target-tsan}"
export RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0 second_deadlock_stack=1}"
cargo +nightly test --locked -Zbuild-std --target x86_64-unknown-linux-gnu \
  --lib --test backend_reg -- "$@"
