# dtrain — top-level entry points. Every target first installs the Debian
# packages that are missing (scripts/deps.sh), then configures and builds.
#   make          build into build/ (CLI at build/dtrain)
#   make test     every test, then the same suite under ASan+UBSan, then fuzzing
#   make demo     train the ConvNet on Fashion-MNIST
#   make bench    benchmarks (figures go to docs/BENCHMARKS.md by hand)
#   make install  headers, library, dtrain.pc, CMake package (PREFIX=/usr/local)

PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
WERROR ?= ON
export OPENBLAS_CORETYPE ?= SkylakeX

.PHONY: all build deps deps-test deps-demo test test-asan test-fast fuzz demo bench install clean test-install

all: build

deps:
	@scripts/deps.sh build
deps-test:
	@scripts/deps.sh test
deps-demo:
	@scripts/deps.sh demo

build/CMakeCache.txt:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDT_WERROR=$(WERROR) $(CMAKE_FLAGS)

build: deps build/CMakeCache.txt
	cmake --build build -j $(JOBS)

build-asan/CMakeCache.txt:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDT_WERROR=$(WERROR) \
	  -DDT_SANITIZE=address,undefined $(CMAKE_FLAGS)

test-fast: deps-test build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps-test build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

fuzz: deps-test
	@scripts/fuzz.sh

test-install: build
	@scripts/test_install.sh

test: test-fast test-install test-asan fuzz

demo: deps-demo build
	scripts/demo.sh

bench: build
	scripts/bench.sh

install: build
	cmake --install build --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-fuzz
