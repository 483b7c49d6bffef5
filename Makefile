# kvchat: two commands do everything on a fresh Debian 12 machine.
#   make run   - install missing packages, build, launch the GUI on the embedded model
#   make test  - install missing packages, build, run the test suites (ctest)
#   make test-sanitize - the same suites on a build with AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz  - libFuzzer targets over every model-file parser and a remote server's answers, FUZZ_SECONDS (60) each
#                (scripts/fuzz.sh)
#   make format / make check-format - apply .clang-format to the C++ sources / fail on a file that differs
#   CMAKE_ARGS - extra options for the first configure, e.g. CMAKE_ARGS=-DKVCHAT_WERROR=ON (warnings are errors)

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
PACKAGES := build-essential cmake ninja-build pkg-config libtorch-dev libopenblas0-pthread \
            qt6-base-dev libqt6sql6-sqlite libspdlog-dev libfmt-dev nlohmann-json3-dev libpcre2-dev libicu-dev \
            libxxhash-dev libcpp-httplib-dev libgl-dev qt6-charts-dev libqt6opengl6-dev clang-14 libclang-rt-14-dev llvm-14 \
            clang-format-14

.PHONY: all deps configure build test run clean bench test-sanitize fuzz format check-format

all: build

deps:
	@./scripts/install-deps.sh $(PACKAGES)

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && QT_QPA_PLATFORM=offscreen ctest --output-on-failure -j $(JOBS)

# Own build folders (build-sanitize/, build-fuzz/); the scripts say how they are built and run.
test-sanitize: deps
	JOBS=$(JOBS) ./scripts/test-sanitize.sh

FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) ./scripts/fuzz.sh

format: deps
	./scripts/format.sh

check-format: deps
	./scripts/format.sh --check

run: build
	./$(BUILD_DIR)/kvchat $(ARGS)

bench: build
	./$(BUILD_DIR)/kvchat-cli bench $(ARGS)

clean:
	rm -rf $(BUILD_DIR) build-sanitize build-fuzz
