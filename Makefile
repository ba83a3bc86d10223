# Plexus: the two commands of the README's Quick start, plus helpers.
#   make demo   install the Debian packages the demo needs, build it, run the MoE demo (docs/moe.md)
#   make test   install missing Debian packages, build, run every test through CTest
# Both are idempotent and work as root (or with sudo) on a fresh Debian 12 machine.

PRESET ?= default
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
# Tests labelled "slow" (PyTorch's own distributed suite: about an hour here) are left out of the
# default run; `make test CTEST_ARGS=` runs them too.
CTEST_ARGS ?= -LE slow

# Debian packages the build, the tests and the benchmarks need.
DEB_PACKAGES := build-essential cmake ninja-build pkg-config git clang clang-format \
  libclang-rt-14-dev libabsl-dev libfmt-dev nlohmann-json3-dev catch2 libcli11-dev \
  libibverbs-dev librdmacm-dev iproute2 procps libgloo-dev openmpi-bin libopenmpi-dev libpmix-dev \
  python3-matplotlib libprotoc-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc \
  python3-torch libtorch-dev pybind11-dev mptcpize iperf3 slurm-wlm etcd-server
# What `make demo` needs: the packages CMake requires to configure, and matplotlib for the demo's
# plot. The optional parts (torch, Gloo, MPI, PMIx, gRPC, Slurm, ...) come with `make test`.
DEMO_PACKAGES := build-essential cmake ninja-build pkg-config libabsl-dev libfmt-dev \
  nlohmann-json3-dev catch2 libcli11-dev libprotoc-dev protobuf-compiler python3-matplotlib

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps demo-deps configure build demo test bench format fuzz clean

all: build

# Installs the missing ones of $(1); a build directory that exists is then configured again, so
# that CMake finds what was just installed.
define install_missing
	@missing=$$(for p in $(1); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "plexus: installing missing Debian packages:" $$missing; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing && \
	  if [ -d $(BUILD_DIR) ]; then touch $(BUILD_DIR)/.plexus-reconfigure; fi; \
	else echo "plexus: all Debian packages present"; fi
endef

deps:
	$(call install_missing,$(DEB_PACKAGES))

demo-deps:
	$(call install_missing,$(DEMO_PACKAGES))

# Configures once, and again after packages were installed.
define configure_build
	@if [ ! -f $(BUILD_DIR)/build.ninja ] || [ -f $(BUILD_DIR)/.plexus-reconfigure ]; then \
	  cmake --preset $(PRESET) && rm -f $(BUILD_DIR)/.plexus-reconfigure; fi
endef

configure: deps
	$(configure_build)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Builds only the demo's own target (and the libraries under it); `make test` builds the rest.
demo: demo-deps
	$(configure_build)
	cmake --build $(BUILD_DIR) -j $(JOBS) --target plexus-moe-demo
	$(BUILD_DIR)/tools/plexus-moe-demo --plot $(BUILD_DIR)/moe-demo.png

# A failure ends with a digest of why each failed test failed (cmake/failure-digest.py), since
# ctest prints a test's output where it ended, far up a long log.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS) || \
	  { python3 $(CURDIR)/cmake/failure-digest.py .; exit 8; }

# Every benchmark (the collectives one with its Gloo and Open MPI peers), each writing its JSON
# lines to $(REPORT_DIR); then tools/plot/plexus-plot draws the PNGs and report.md there. A
# benchmark that fails is named at the end and the others still run; one that cannot run on this
# machine (plexus-bench-cuda without a GPU) exits 77 and is reported as skipped.
REPORT_DIR ?= $(BUILD_DIR)/bench-report
BENCHES ?= transport pull collectives placement moe rpc aggregation multipath torch torch_ddp cuda
BENCH_ARGS_collectives ?= --compare --runs 3 --ops all
BENCH_ARGS_rpc ?= --compare
BENCH_ARGS_aggregation ?= --compare --runs 3
BENCH_ARGS_multipath ?= --compare
BENCH_ARGS_cuda ?= --transport shm,tcp --np 2 --runs 5
# plexus vs gloo through torch.distributed, 2 and 4 processes, medians of 5 (docs/torch.md).
BENCH_ARGS_torch ?= --nprocs 2,4 --runs 5
BENCH_ARGS_torch_ddp ?= --nprocs 2,4 --hidden 64,512,1024,2048 --batch 4 --steps 10 --runs 5

bench: build
	@mkdir -p $(REPORT_DIR); failed=""; \
	for b in $(BENCHES); do \
	  exe=$(BUILD_DIR)/bench/plexus-bench-$$b; \
	  if [ ! -x $$exe ]; then echo "== $$b: not built, skipped"; continue; fi; \
	  echo "== $$b -> $(REPORT_DIR)/$$b.jsonl"; \
	  $$exe --json $(BENCH_ARGS_$$b) > $(REPORT_DIR)/$$b.jsonl; rc=$$?; \
	  if [ $$rc = 77 ]; then echo "== $$b: skipped (see its message)"; \
	  elif [ $$rc != 0 ]; then failed="$$failed $$b"; fi; \
	done; \
	/usr/bin/python3 tools/plot/plexus-plot report $(REPORT_DIR) || echo "plexus-plot: no pictures (see above)"; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi; \
	echo "report: $(REPORT_DIR)/report.md"

format:
	git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' '*.cu' '*.cuh' | xargs -r clang-format -i

clean:
	rm -rf $(BUILD_DIR)
