# kvseal — thin wrapper over CMake. `make help` lists the targets.
JOBS ?= $(shell nproc)
BUILD ?= build
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= $(JOBS)

.PHONY: all test asan stress-test bench fuzz clean help

all: ## configure and build build/kvseal (Release, -Werror)
	@cmake -S . -B $(BUILD) -DKS_WERROR=ON >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

test: all ## build and run the whole test suite
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

asan: ## build with AddressSanitizer+UBSan in build-asan and run the suite
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKS_WERROR=ON -DKS_SANITIZE=address,undefined >/dev/null
	@cmake --build build-asan -j$(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS)

stress-test: ## the whole suite 10x (STRESS_RUNS) with ctest -j4 beside a CPU hog, then once under ASan
	@scripts/stress-test.sh

bench: all ## build the kernel micro-benchmarks (build/bench_kern, build/bench_stream)
	@cmake --build $(BUILD) --target bench_kern bench_stream -j$(JOBS)

fuzz: ## build the libFuzzer harnesses (clang) in build-fuzz; run each FUZZ_SECONDS (60), FUZZ_JOBS at a time
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKS_FUZZ=ON -DKS_WERROR=ON >/dev/null
	@cmake --build build-fuzz -j$(JOBS)
	@scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ_TARGETS)

clean: ## remove build directories
	rm -rf build build-asan build-fuzz build-stress-logs

help:
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
