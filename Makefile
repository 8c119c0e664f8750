# Two commands a newcomer needs: `make run` and `make test`. Everything else bootstraps itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run relay test lint typecheck format clean proto dist dist-check constraints compat

# Idempotent: re-installs only when pyproject.toml or constraints.txt changed since the last install.
# constraints.txt locks the newest supported set, so `make test` runs on the same versions everywhere.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/bastion dev-keys --dir .dev
	$(BIN)/bastion run examples.documents_api:service --config examples/documents_api/config.toml

# MailRelay with development defaults for what is not set in the environment or in ./.env:
# targets inbox@example.test, webhook http://127.0.0.1:9000/webhook, health on 8081 (bastion's
# `make run` has 8080). SMTP listens on 2525. See docs/mailrelay.md.
relay: install
	@set_default() { \
		if [ -z "$$(printenv $$1)" ] && ! grep -Eqs "^[[:space:]]*(export[[:space:]]+)?$$1=" .env; then \
			export "$$1=$$2"; echo "make relay: $$1=$$2 (development default)"; \
		fi; \
	}; \
	set_default MAIL_RELAY_TARGET_EMAILS inbox@example.test; \
	set_default MAIL_RELAY_WEBHOOK_URL http://127.0.0.1:9000/webhook; \
	set_default MAIL_RELAY_HEALTH_PORT 8081; \
	exec $(BIN)/mailrelay

lint: install
	$(BIN)/ruff check src tests examples bench reliability distributions
	$(BIN)/ruff format --check src tests examples bench reliability distributions
	$(BIN)/lint-imports --no-cache

typecheck: install
	$(BIN)/mypy

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them so its module
# fixtures start once; every worker starts its own session servers (Valkey, NATS, moto, DNS) on free ports.
# TEST_WORKERS=0 runs it in this process (pdb, -s). One file or test: .venv/bin/pytest tests/<path>.
TEST_WORKERS ?= 2
PYTEST_WORKERS = -n $(TEST_WORKERS) --dist loadfile

test: install lint typecheck
	$(BIN)/pytest $(PYTEST_WORKERS)

format: install
	$(BIN)/ruff format src tests examples distributions
	$(BIN)/ruff check --fix src tests examples distributions

clean:
	rm -rf $(VENV) .venv-compat-* .pytest_cache .mypy_cache .ruff_cache dist build

# The sdist and wheel of each distribution (bastion, mailrelay, bastion-core) into dist/, from
# distributions/<name>/pyproject.toml (docs/installation.md).
dist: install
	rm -rf dist build/distributions
	$(BIN)/python distributions/build.py

# The wheels as a user gets them: `make dist`, then the Bastion wheel and the MailRelay wheel each alone in a fresh
# virtual environment (dependencies from the package index), serving a secured service / delivering a signed
# webhook (tests/dist/check_wheels.py; a few minutes, so not in `make test`; .ci/run runs it).
dist-check: install
	$(BIN)/pytest -p no:cacheprovider --timeout=1800 tests/dist/check_wheels.py

# Regenerate the lock of the newest set after raising a range in pyproject.toml (upgrade .venv first:
# `.venv/bin/pip install -U -e '.[dev]'`).
constraints: install
	{ sed -n '1,2p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^bastion=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

# The supported ranges' other ends (docs/installation.md, "Supported versions"): each set in compat/<set>.txt
# gets its own virtual environment and runs the compatibility subset: the compat tests (which say per version
# which features are on), the differential test of the compiled handlers, the listener and gRPC tests, and the
# example's end-to-end suite. `make test` covers the newest set (constraints.txt). .ci/run runs both.
COMPAT_SETS := oldest middle
COMPAT_TESTS := tests/bastion/compat tests/bastion/routing/test_compiled.py tests/bastion/test_listener.py \
	tests/bastion/test_listener_framing.py tests/bastion/test_grpc_deadlines.py tests/bastion/test_grpc_frames.py \
	tests/bastion/test_grpc_hpack.py tests/bastion/test_grpc_metadata.py tests/bastion/test_grpc_transport.py \
	tests/bastion/ratelimit/test_distributed.py tests/mailrelay/smtp/test_compat.py tests/e2e

.venv-compat-%/.installed: pyproject.toml compat/%.txt
	test -x .venv-compat-$*/bin/python || $(PYTHON) -m venv .venv-compat-$*
	.venv-compat-$*/bin/python -m pip install -q --upgrade pip
	.venv-compat-$*/bin/python -m pip install -q -e '.[dev]' -c compat/$*.txt
	touch $@

compat: $(foreach set,$(COMPAT_SETS),.venv-compat-$(set)/.installed)
	@for set in $(COMPAT_SETS); do \
		echo "make compat: $$set set ($$(.venv-compat-$$set/bin/python -m pip list 2>/dev/null \
			| awk '$$1 ~ /^(fastapi|starlette|uvicorn|grpclib|h2|aiosmtpd)$$/ {printf "%s %s ", $$1, $$2}'))"; \
		.venv-compat-$$set/bin/pytest -p no:cacheprovider $(PYTEST_WORKERS) $(COMPAT_TESTS) || exit 1; \
	done

# Schemathesis, every check, against `bastion run` of the example (v1 and v2; docs/api-docs.md).
.PHONY: schemathesis
schemathesis: install
	$(BIN)/python -m tests.e2e.schemathesis_example

# Regenerate the example's gRPC code (committed; run after editing a .proto file).
PROTO_DIR := examples/documents_api/proto
proto: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I . --python_out=. \
		--grpclib_python_out=. --grpc_python_out=. \
		$(PROTO_DIR)/documents/v1/documents.proto

# Benchmarks (bench/README.md): wrk and h2load (nghttp2-client) from Debian packages when missing and apt-get
# can run, else the Python load generators (bench/pyload.py, bench/grpcload.py's grpc.aio client). `bench` writes bench/results/<date>.md; `bench-quick` only prints.
BENCH_STAMP := $(VENV)/.installed-bench
.PHONY: bench bench-quick bench-tools bench-check

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench-tools: install $(BENCH_STAMP)
	@command -v wrk >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get update -qq && apt-get install -y -qq wrk) >/dev/null 2>&1 || true; \
		fi; \
		command -v wrk >/dev/null 2>&1 || echo "make bench: wrk unavailable; HTTP rows use bench/pyload.py"; \
	}
	@command -v h2load >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq nghttp2-client || (apt-get update -qq && apt-get install -y -qq nghttp2-client)) \
				>/dev/null 2>&1 || true; \
		fi; \
		command -v h2load >/dev/null 2>&1 || echo "make bench: h2load unavailable; gRPC rows use the grpc.aio client"; \
	}

bench: install bench-tools
	$(BIN)/python -m bench.harness

bench-quick: install bench-tools
	$(BIN)/python -m bench.harness --quick

# Every row of the harness started and measured for 0.3 s (no timing asserted): CI runs it beside `make test`.
bench-check: install
	$(BIN)/pytest -p no:cacheprovider tests/bench/check_harness.py

# The documentation site: docs/ with MkDocs (Material theme) into build/site/, every link checked (--strict).
DOCS_STAMP := $(VENV)/.installed-docs
.PHONY: docs deploy-check deploy-tools

$(DOCS_STAMP): pyproject.toml constraints.txt $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,docs]' -c constraints.txt
	touch $(DOCS_STAMP)

docs: install $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# deploy/ checked by the formats' own tools (docs/deployment.md): hadolint, kubernetes-validate, check-jsonschema
# (pip, the deploy extra), promtool (Debian's prometheus package, installed when missing and apt-get can run) and
# systemd-analyze (systemd), run by tests/deploy/check_tools.py; tests/deploy/check_metrics.py scrapes real `bastion run`
# and `mailrelay` processes for every metric the dashboards and alert rules use. CI (.ci/run) runs it.
DEPLOY_STAMP := $(VENV)/.installed-deploy

$(DEPLOY_STAMP): pyproject.toml constraints.txt $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,deploy]' -c constraints.txt
	touch $(DEPLOY_STAMP)

deploy-tools: install $(DEPLOY_STAMP)
	@command -v promtool >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq --no-install-recommends prometheus \
				|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus)) >/dev/null 2>&1 || true; \
		fi; \
	}
	@command -v systemd-analyze >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq --no-install-recommends systemd \
				|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd)) >/dev/null 2>&1 || true; \
		fi; \
	}

deploy-check: deploy-tools
	$(BIN)/pytest -p no:cacheprovider tests/deploy/check_tools.py tests/deploy/check_metrics.py

# Reliability figures (docs/reliability.md): every scenario against real processes on loopback (load, faults,
# hostile clients, fuzz), one table at the end, non-zero exit when a figure misses its bound (< 15 min).
# `reliability-quick` runs the short versions (the ones `make test` runs as tests/reliability/).
.PHONY: reliability reliability-quick

reliability: install bench-tools
	$(BIN)/python -m reliability

reliability-quick: install
	$(BIN)/python -m reliability --quick
