# localvol — build, run and test.
#   make run    build and start the driver on an embedded default config
#   make test   everything CI runs (.ci/run calls exactly this)

CARGO      ?= cargo
DATA       ?= $(CURDIR)/.localvol
SOCKET     := $(DATA)/csi.sock
NODE       ?= $(shell hostname)
BIN        := target/release/localvol
IMAGE      ?= localvol:dev

.PHONY: run build test fmt-check clippy unit sanity test-vm bench image clean

build:
	$(CARGO) build --release --bin localvol

# One directory pool under $(DATA)/pool, the socket beside it, staging and
# target paths allowed under $(DATA)/kubelet. No cluster needed.
run: build
	@mkdir -p $(DATA)/kubelet
	@echo "localvol: serving on unix://$(SOCKET) (pool: $(DATA)/pool). Try, in another shell:"
	@echo "  export CSI_ENDPOINT=unix://$(SOCKET)"
	@echo "  $(BIN) client info"
	@echo "  $(BIN) client capacity"
	@echo "  $(BIN) client create demo --size 100Mi"
	@echo "  $(BIN) client list"
	@echo "  mkdir -p $(DATA)/kubelet/staging $(DATA)/kubelet/pods   # as kubelet would; mounting needs root"
	@echo "  $(BIN) client stage <ID> --staging-path $(DATA)/kubelet/staging/demo"
	@echo "  $(BIN) client publish <ID> --staging-path $(DATA)/kubelet/staging/demo --target-path $(DATA)/kubelet/pods/demo"
	@echo "  $(BIN) client stats <ID> --volume-path $(DATA)/kubelet/pods/demo"
	@echo "  $(BIN) client unpublish <ID> --target-path $(DATA)/kubelet/pods/demo"
	@echo "  $(BIN) client unstage <ID> --staging-path $(DATA)/kubelet/staging/demo"
	@echo "  $(BIN) client delete <ID>"
	exec $(BIN) serve --endpoint unix://$(SOCKET) --data-dir $(DATA) \
		--kubelet-dir $(DATA)/kubelet --node-id $(NODE)

test: fmt-check clippy unit sanity

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --exclude sanity-tests

# The conformance suite starts the real binary; mount tests need root.
sanity:
	$(CARGO) build --bin localvol
	$(CARGO) test -p sanity-tests

bench: build
	@echo "Start the driver, then: $(BIN) bench --endpoint unix://$(SOCKET) --volumes 2000 --concurrency 4"

# For users with a container engine (none runs on the CI machines).
image:
	docker build -t $(IMAGE) .

clean:
	$(CARGO) clean
