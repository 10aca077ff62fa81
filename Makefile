# dtrain — top-level entry points. Every target first installs the Debian
# packages that are missing (scripts/deps.sh), then configures and builds.
#   make              build into build/ (CLI at build/dtrain)
#   make test         every test, then the same suite under ASan+UBSan, then
#                     fuzzing; ends with the test counts of each pass.
#                     SANITIZE=0 leaves out the sanitizer passes (ASan+UBSan
#                     and ThreadSanitizer), TSAN=0 only the ThreadSanitizer
#                     one, FUZZ=0 the fuzzers (make test SANITIZE=0 FUZZ=0:
#                     the plain suite and the install check only).
#                     RELEASE=0 leaves out the plain suite and the install
#                     check (CI, .ci/run: they run in the fresh root of
#                     make fresh-check instead of twice)
#   make test-tsan    the tests labelled `threads` under ThreadSanitizer
#   make demo         train the ConvNet on Fashion-MNIST (DEMO_LIMIT=N: only
#                     the first N training images, for a short demo)
#   make demo-gpt-data  the GPT demo's data: the King James Bible (Debian's
#                     bible-kjv), a byte-level BPE vocabulary learned on it and
#                     train/val token files in build/gpt-data/
#   make demo-gpt     train a small GPT on the Bible for a few minutes, print
#                     its validation loss against the unigram baseline and a
#                     generated sample (DT_DEMO_GPT_STEPS=N steps, default 400)
#   make demo-llama   train the small Llama (llama-tiny) from scratch on the
#                     Bible for a short run (about a minute) with a
#                     tokenizer.json dtrain wrote, write it as a Hugging Face
#                     model directory and generate from it through that
#                     tokenizer (DT_DEMO_LLAMA_STEPS=N steps, default 300;
#                     with PEER_PYTHON set to a python with transformers, also
#                     shows transformers continuing with the same tokens and text)
#   make bench        benchmarks (figures go to docs/BENCHMARKS.md by hand)
#   make install      headers, library, dtrain.pc, CMake package, the dtrain
#                     program (PREFIX=/usr/local)
#   make fresh-check  the README's two commands in a fresh minimal Debian
#                     bookworm root (scripts/fresh_check.sh: debootstrap from
#                     this machine's apt mirror; needs root and that network)

PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
# ctest's slots: a test takes two, one if it is labelled idle (mostly
# waiting; CMakeLists.txt), so JOBS tests compute at once and waiting ones
# run beside them.
CTEST_JOBS = $(shell expr 2 \* $(JOBS))
CMAKE_FLAGS ?=
WERROR ?= ON
RELEASE ?= 1
SANITIZE ?= 1
TSAN ?= $(SANITIZE)
FUZZ ?= 1
DEMO_LIMIT ?= 0
export OPENBLAS_CORETYPE ?= SkylakeX

# What scripts/deps.sh test installs for the tests: a test that finds one of
# these missing fails instead of skipping (DT_TEST_SKIP_NEED in tests/test.h).
TEST_REQUIRE := numpy gnuplot mpi fashion-mnist bible iproute2

# The passes of `make test` and the build trees whose CTest results the
# closing summary reports. A new pass adds itself to both lists.
TEST_STAGES :=
TEST_DIRS :=
ifneq ($(RELEASE),0)
TEST_STAGES += test-fast test-install
TEST_DIRS += build
endif
ifneq ($(SANITIZE),0)
TEST_STAGES += test-asan
TEST_DIRS += build-asan
endif
ifneq ($(TSAN),0)
TEST_STAGES += test-tsan
TEST_DIRS += build-tsan
endif
ifneq ($(FUZZ),0)
TEST_STAGES += fuzz
endif

.PHONY: all build deps deps-test deps-fuzz deps-demo test test-asan test-tsan test-fast fuzz demo demo-gpt-data demo-gpt demo-llama bench \
        install clean test-install fresh-check

all: build

# The targets here run one at a time even under `make -j N`: each target's
# own work is the parallel part (cmake --build -j, ctest -j), and the
# prerequisites are ordered steps (deps installs the packages that the
# configure after it needs; two apt-get runs at once would fight over
# dpkg's lock). `make -j 2 build` on a fresh machine configured before
# deps had installed oneDNN and failed.
.NOTPARALLEL:

deps:
	@scripts/deps.sh build
deps-test:
	@scripts/deps.sh test
deps-fuzz:
	@scripts/deps.sh fuzz
deps-demo:
	@scripts/deps.sh demo

build/CMakeCache.txt:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDT_WERROR=$(WERROR) $(CMAKE_FLAGS)

build: deps build/CMakeCache.txt
	cmake --build build -j $(JOBS)

# -O1, as AddressSanitizer's documentation suggests for speed: at -O0 this
# suite took 750 s of CI's 34 minutes on an AVX2 machine with 2 cores, and
# its heaviest tests a third less time at -O1 (assertions stay on: no NDEBUG).
build-asan/CMakeCache.txt:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDT_WERROR=$(WERROR) \
	  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
	  -DDT_SANITIZE=address,undefined $(CMAKE_FLAGS)

test-fast: deps-test build
	cd build && DT_TEST_REQUIRE="$(TEST_REQUIRE)" ctest --output-on-failure -j $(CTEST_JOBS) -O ctest.log

test-asan: deps-test build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	cd build-asan && DT_TEST_REQUIRE="$(TEST_REQUIRE)" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(CTEST_JOBS) -O ctest.log

# ThreadSanitizer over the tests labelled `threads` (// dt-test-labels),
# those that run dtrain code on more than one thread: the progress engine,
# the loader's thread, DDP's overlapped reductions, ranks as threads. Only
# those tests and the CLI are built. OpenMP: libgomp is not instrumented, so
# TSan cannot see the synchronisation at the end of a parallel region and
# would report false races between OpenMP workers. Rather than suppress
# anything, this build has no OpenMP of its own (DT_OPENMP=OFF: dtrain's
# kernels run serially on the calling thread) and OMP_NUM_THREADS=1 keeps
# oneDNN's OpenMP regions on the calling thread too; every thread TSan sees
# is one that dtrain or a test started with pthread_create, and no report
# is suppressed. halt_on_error: a race fails the test (exit 66), in forked
# ranks and in the CLI's ranks alike.
build-tsan/CMakeCache.txt:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DDT_WERROR=$(WERROR) \
	  -DDT_SANITIZE=thread -DDT_OPENMP=OFF $(CMAKE_FLAGS)

# (a test registered in a tests.cmake under a name that is no target, such as
# kernels/test_amx_gemm_hw running test_amx_gemm, is left out of the target
# list; its program is built under its own test's name. `cmake .` first: in a
# tree configured before new tests were added, the target list would lack them)
test-tsan: deps-test build-tsan/CMakeCache.txt
	cd build-tsan && cmake . > /dev/null && targets=$$(cmake --build . --target help | sed -n 's/^\.\.\. \([A-Za-z0-9_]*\)$$/\1/p') && \
	  cmake --build . -j $(JOBS) --target dtrain_cli \
	    $$(ctest -N -L threads | sed -n 's|^ *Test *#[0-9]*: [a-z]*/||p' | \
	       while read -r t; do printf '%s\n' "$$targets" | grep -qx "$$t" && echo "$$t"; done)
	cd build-tsan && DT_TEST_REQUIRE="$(TEST_REQUIRE)" OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest -L threads --output-on-failure -j $(CTEST_JOBS) -O ctest.log

fuzz: deps-fuzz
	@scripts/fuzz.sh

test-install: build
	@scripts/test_install.sh

test: $(TEST_STAGES)
	@scripts/test_summary.sh $(TEST_DIRS)

demo: deps-demo build
	DT_DEMO_LIMIT=$(DEMO_LIMIT) scripts/demo.sh

demo-gpt-data: deps-demo build
	scripts/gpt_data.sh

demo-gpt: deps-demo build
	scripts/demo_gpt.sh

demo-llama: deps-demo build
	scripts/demo_llama.sh

bench: build
	scripts/bench.sh

install: build
	cmake --install build --prefix $(PREFIX)

fresh-check:
	@scripts/deps.sh fresh-check
	scripts/fresh_check.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz
