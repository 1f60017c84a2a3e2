#!/usr/bin/env bash
# Runs the library's unit tests under Miri (undefined behaviour, data races, leaks of the Rust code).
# Installs nothing: needs `rustup toolchain install nightly --component miri rust-src`. Not part of CI
# (CI has no nightly); run it by hand after touching unsafe code, the request slab or the FFI guard.
#
# Isolation stays on (no host files, sockets, clock of the host or environment): host calls that the
# code tolerates failing return an error (-Zmiri-isolation-error=warn-nobacktrace); tests that need
# the host (TCP sockets, fixtures or docs on disk, temp dirs, libibverbs, the C helpers from build.rs)
# carry `#[cfg_attr(miri, ignore = "why")]` and are listed as ignored with that reason. Proptest
# blocks run 8 cases without a persistence file. Exits non-zero on a failing test or a Miri error.
#
# Usage: scripts/miri.sh [libtest args, e.g. a module path: plugin::slab]
set -euo pipefail
cd "$(dirname "$0")/.."
export MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-isolation-error=warn-nobacktrace \
-Zmiri-env-set=PROPTEST_DISABLE_FAILURE_PERSISTENCE=1 -Zmiri-env-set=PROPTEST_CASES=8"
exec cargo +nightly miri test --locked --lib -- "$@"
