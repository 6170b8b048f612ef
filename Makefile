# Thin wrapper so a fresh Debian 12 machine needs one command for each job.
#   make demo   install deps, build, run gateway + simulated engines, stream a request
#   make test   install deps, build, run the whole suite (ctest)
#   make bench  install bench deps, profile-guided build, run the benchmarks of tests/bench/
MAKEFLAGS += --no-print-directory
BUILD     ?= build
SAN_BUILD ?= build-sanitize
TSAN_BUILD ?= build-tsan
JOBS      ?= $(shell nproc)
CTEST_ARGS ?=
# Integration tests run real processes against wall-clock deadlines; on a loaded 2-core
# machine one may miss a deadline. A test that fails twice in a row fails the run.
CTEST_RETRY ?= --repeat until-pass:2

.PHONY: all deps build build-pgo test test-sanitize test-tsan test-torture fuzz demo bench clean format docs

all: build

DEPS_JOB ?= build

deps:
	@./deploy/install-deps.sh $(DEPS_JOB)

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

# Profile-guided build (what `make bench` measures): an instrumented pass, the training load
# of tests/bench/pgo_train.sh (pdgw in front of pdgw-sim), then the optimised pass, all in
# $(PGO_BUILD). Tests are not built there; `make test` checks the same sources.
PGO_BUILD ?= build-pgo
build-pgo: DEPS_JOB = demo
build-pgo: deps
	cmake -S . -B $(PGO_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDGW_BUILD_TESTS=OFF \
	    -DPDGW_PGO=generate
	cmake --build $(PGO_BUILD) -j $(JOBS) --target pdgw pdgw-sim
	rm -rf $(PGO_BUILD)/pgo-profile
	./tests/bench/pgo_train.sh $(PGO_BUILD)/bin
	cmake -S . -B $(PGO_BUILD) -DPDGW_PGO=use
	cmake --build $(PGO_BUILD) -j $(JOBS)

# Tests on explicitly: a build tree first made by `make demo` has them off.
test: DEPS_JOB = test
test: deps $(BUILD)/Makefile
	cmake -S . -B $(BUILD) -DPDGW_BUILD_TESTS=ON >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_RETRY) $(CTEST_ARGS)

$(SAN_BUILD)/Makefile:
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPDGW_SANITIZE=ON

test-sanitize: DEPS_JOB = test
test-sanitize: deps $(SAN_BUILD)/Makefile
	cmake --build $(SAN_BUILD) -j $(JOBS)
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    ctest --output-on-failure -j $(JOBS) -LE 'nosanitize|torture' $(CTEST_RETRY) $(CTEST_ARGS)

# Torture (curl's torture mode on libpdb's wrapper): the unit suites of tests/torture/ re-run
# in the sanitizer build with allocation N failing, for every N (spread evenly when a suite
# allocates too much for its time budget). Every run must end without a crash in library
# code, a sanitizer error, a hang, or a leak (tests/torture/run_torture.py).
test-torture: DEPS_JOB = test
test-torture: deps $(SAN_BUILD)/Makefile
	cmake --build $(SAN_BUILD) -j $(JOBS)
	cd $(SAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L torture $(CTEST_ARGS)

$(TSAN_BUILD)/Makefile:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPDGW_TSAN=ON

# The unit suites under ThreadSanitizer: a report makes the test fail (TSan's
# exit code 66). The integration tests are left out: the processes they start
# are not checked for reports, and their wall-clock bounds do not hold under
# TSan. The only suppressions are for uninstrumented third-party libraries
# (tests/tsan.supp).
test-tsan: DEPS_JOB = test
test-tsan: deps $(TSAN_BUILD)/Makefile
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && \
	    TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp second_deadlock_stack=1" \
	    ctest --output-on-failure -j $(JOBS) -L unit $(CTEST_RETRY) $(CTEST_ARGS)

FUZZ_BUILD ?= build-fuzz
# libFuzzer targets (clang, tests/fuzz/README.md): every parser of network or
# user input, each for a short fixed time (PDGW_FUZZ_SECONDS, default 6 s).
fuzz: DEPS_JOB = test
fuzz: deps
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDGW_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) -L fuzz

# The demo builds quietly (one line; the log is shown only when the build fails)
# so its streamed answer is what the terminal shows.
demo: DEPS_JOB = demo
demo: deps
	@mkdir -p $(BUILD)
	@echo "demo: building pdgw (log in $(BUILD)/build.log)"
	@if ! { test -f $(BUILD)/Makefile || \
	        cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDGW_BUILD_TESTS=OFF; \
	      } >$(BUILD)/build.log 2>&1 || \
	    ! cmake --build $(BUILD) -j $(JOBS) --target pdgw pdgw-sim >>$(BUILD)/build.log 2>&1; then \
	    tail -n 40 $(BUILD)/build.log; \
	    echo "demo: build failed (full log in $(BUILD)/build.log)" >&2; exit 1; \
	fi
	@./deploy/demo.sh $(BUILD)/bin

bench: DEPS_JOB = bench
bench: deps build-pgo
	BENCH_CMD="make bench" ./tests/bench/run_all.sh $(PGO_BUILD)/bin

# gateway/CONFIG.md's reference tables, printed from the option table (gw_config_docs checks).
docs: $(BUILD)/Makefile
	cmake --build $(BUILD) --target pdgw-config-doc -j $(JOBS)
	python3 gateway/tools/config_docs.py $(BUILD)/bin --write

format:
	find gateway forwarders kvtransfer scheduler tests -name '*.[ch]' -print0 | xargs -0 clang-format -i

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD) $(PGO_BUILD)
