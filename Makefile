# kvseal — thin wrapper over CMake. `make help` lists the targets.
JOBS ?= $(shell nproc)
BUILD ?= build
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= $(JOBS)

.PHONY: all test asan tsan stress-test bench fuzz clean help

all: ## configure and build build/kvseal (Release, -Werror)
	@cmake -S . -B $(BUILD) -DKS_WERROR=ON >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

test: all ## build and run the whole test suite
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

asan: ## build with AddressSanitizer+UBSan in build-asan and run the suite
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKS_WERROR=ON -DKS_SANITIZE=address,undefined >/dev/null
	@cmake --build build-asan -j$(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS)

# The ThreadSanitizer subset: the grammar, engine, server and cluster unit tests
# (unit_grammar with its matchers on four threads) and the
# end-to-end tests where the threads meet most (the HTTP sweeper with
# disconnects, drains and slow clients, the leak suite, embeddings, a
# cluster's workers, the engine's mask threads under load). TSan reports of any process (the e2e tests' servers
# too) are written to build-tsan/tsan-report.PID and fail the run. UCX_MEM_EVENTS=no:
# libucm's madvise hook (libucx, the UCX data plane) takes a lock TSan's
# interceptor crashes in when a thread's stack is released; nothing here needs it.
TSAN_TESTS ?= ^(unit_(grammar|engine|server|cluster).*|e2e_test_(serve_(drain|half_close|slow_clients|queue|models)|lora_serve|leak|openai|embeddings|fairness|structured|cluster_(roles|drain|same_tokens)))$$
TSAN_EXCLUDE ?= ^$$
TSAN_TARGETS = kvseal rawc $(patsubst tests/unit/%.c,%,\
	$(wildcard tests/unit/test_grammar*.c tests/unit/test_engine*.c tests/unit/test_server*.c \
	tests/unit/test_cluster*.c))
tsan: ## build with ThreadSanitizer in build-tsan and run the grammar, engine, server and cluster tests (TSAN_TESTS)
	@cmake -S . -B build-tsan -DKS_WERROR=ON -DKS_SANITIZE=thread -DKS_FUZZ_SMOKE=OFF >/dev/null
	@cmake --build build-tsan -j$(JOBS) --target $(TSAN_TARGETS)
	@rm -f build-tsan/tsan-report.*
	@rc=0; (cd build-tsan && UCX_MEM_EVENTS=no TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 \
		log_path=$(CURDIR)/build-tsan/tsan-report" ctest --output-on-failure -j$(JOBS) \
		-R '$(TSAN_TESTS)' -E '$(TSAN_EXCLUDE)') || rc=1; \
	if ls build-tsan/tsan-report.* >/dev/null 2>&1; then cat build-tsan/tsan-report.*; \
		echo "tsan: ThreadSanitizer reports (above)" >&2; rc=1; fi; exit $$rc

stress-test: ## the whole suite 10x (STRESS_RUNS) with ctest -j4 beside a CPU hog, then once under ASan
	@scripts/stress-test.sh

bench: all ## build the kernel micro-benchmarks (build/bench_kern, build/bench_stream, build/bench_attn)
	@cmake --build $(BUILD) --target bench_kern bench_stream bench_attn -j$(JOBS)

fuzz: ## build the libFuzzer harnesses (clang) in build-fuzz; run each FUZZ_SECONDS (60), FUZZ_JOBS at a time
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKS_FUZZ=ON -DKS_WERROR=ON >/dev/null
	@cmake --build build-fuzz -j$(JOBS)
	@scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ_TARGETS)

clean: ## remove build directories
	rm -rf build build-asan build-tsan build-fuzz build-stress-logs

help:
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
