# switchless: build, install, test.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
BINDIR ?= $(PREFIX)/bin
CARGO ?= cargo
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
# Debian architecture of `make deb`: this host's by default; another one (ARCH=arm64 on an amd64 host)
# is cross-built (scripts/cross.sh: toolchain, cargo --target, qemu-user for the man pages).
HOST_ARCH := $(shell dpkg --print-architecture 2>/dev/null)
ARCH ?= $(HOST_ARCH)
# uname -m spellings of the same architectures.
override ARCH := $(patsubst x86_64,amd64,$(patsubst aarch64,arm64,$(ARCH)))

.PHONY: all build cross-build deps install uninstall deb test demo lab perf docs gpu-selftest gpu-selftest-stage

all: build

deps:
	scripts/deps.sh

build: deps
	$(CARGO) build --release --locked

# Installs libnccl-net-switchless.so (the name NCCL looks for with NCCL_NET_PLUGIN=switchless) and the CLI.
install: build
	install -Dm755 $(TARGET_DIR)/release/libswitchless.so $(DESTDIR)$(LIBDIR)/libnccl-net-switchless.so
	install -Dm755 $(TARGET_DIR)/release/switchless $(DESTDIR)$(BINDIR)/switchless

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libnccl-net-switchless.so $(DESTDIR)$(BINDIR)/switchless

# The release build for ARCH on a host of another architecture: the cross toolchain and Rust target
# (installed when missing), then cargo build --release --target (into $(TARGET_DIR)/<rust target>/release).
cross-build:
	scripts/cross.sh deps $(ARCH)
	scripts/cross.sh build $(ARCH)

# The Debian package (scripts/deb.sh, dpkg-deb): the plugin in /usr/lib/<multiarch> (NCCL finds it with
# no LD_LIBRARY_PATH), the CLI, man pages and shell completions. Prints the .deb's path.
# ARCH=arm64 on an amd64 host: the same package for aarch64 (GB10 / DGX Spark), cross-built.
deb: $(if $(filter $(HOST_ARCH),$(ARCH)),build,cross-build)
	TARGET_DIR=$(TARGET_DIR) DEB_ARCH=$(ARCH) scripts/deb.sh $(DEBDIR)

# Every test: unit and integration tests, then each end-to-end step in .ci/steps/ in order.
test: deps
	$(CARGO) test --locked --all-targets
	@set -e; for s in .ci/steps/*.sh; do [ -e "$$s" ] || continue; echo "== $$s"; bash "$$s"; done

# The main demo: doctor on this host, then a 3-node switchless soft-RoCE mesh moving verified data
# through the plugin, with a report (routes, bandwidth and latency vs perftest, verification).
demo: deps
	scripts/demo.sh

# The soft-RoCE VM lab (root): TOPO=pair|mesh3|ring4 or a .topo file.
TOPO ?= pair
lab: build
	lab/run.sh $(TOPO)

# docs/performance.md: every table and plot (the protocol over the rate-modelled fabric, virtual time;
# CPU per GB in real time), regenerated from `switchless bench --model` (release build).
perf: deps
	python3 scripts/perf.py

# The book (mkdocs.yml, pages under docs/) into target/book, links checked; then the README and the pages
# generated from the code (scripts/docs.py --update rewrites those).
docs:
	bash .ci/steps/20-docs.sh
	python3 scripts/docs.py --check

# The plugin under a stock NCCL on one GPU (docs/gpu-selftest.md): stage the stripped release .so and CLI
# here (nccl-tests/gpu/stage/; ARGS=--with-ibverbs for a GPU host without rdma-core), then run the check
# there (root; ARGS passes options, e.g. ARGS="--out /tmp/selftest").
gpu-selftest-stage:
	nccl-tests/gpu-selftest.sh --stage $(ARGS)

gpu-selftest:
	nccl-tests/gpu-selftest.sh $(ARGS)
