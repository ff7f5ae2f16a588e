# localvol — build, run and test.
#   make run    build and start the driver on an embedded default config
#   make test   everything CI runs (.ci/run calls exactly this)

CARGO      ?= cargo
DATA       ?= $(CURDIR)/.localvol
SOCKET     := $(DATA)/csi.sock
NODE       ?= $(shell hostname)
BIN        := target/release/localvol
IMAGE      ?= localvol:dev

.PHONY: run build test e2e-prebuild release-prebuild fmt-check clippy unit rbac-needs sanity soak upstream-sanity validate-deploy deploy-base test-vm test-image image-programs e2e e2e-upstream e2e-build bench bench-vm bench-cbt symbol-order image clean

build:
	$(CARGO) build --release --locked --bin localvol

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

# The host stages first, one after another (cargo wants both cores), then the VM suites
# (test-vm), then the cluster's stories (e2e), each alone on the machine; the cluster's Go
# tools build in the background from the start (e2e-prebuild). Both the VM suites and the
# stories run even when the other failed, so one run reports all failures.
# Alone, not side by side: two TCG guests on two cores slow each other down far more than they
# save (VM suites alone 1,621 s, stories alone about 1,900 s; side by side 4,280-4,774 s and
# 3,500-4,000 s; figures in docs/testing.md).
TEST_LOGS := $(CURDIR)/target/test-logs
# test-image's lifecycle is not run here: the e2e stories run the driver image made from the
# same root (vm/image-root) through every one of its steps on a real node; image-programs
# keeps its checks that the stories cannot see (every program the driver may run, thin_check).
# A failed story's reasons are printed again last (e2e/run's digest): a CI log keeps its tail.
E2E_FAILURES := $(or $(E2E_WORK),/var/tmp/localvol-e2e)/logs/failures.txt
test: e2e-prebuild release-prebuild fmt-check clippy unit sanity upstream-sanity validate-deploy image-programs
	@rm -f $(E2E_FAILURES)
	@rc=0; s=$$(date +%s); \
	$(MAKE) --no-print-directory test-vm VM_TEST_TIMEOUT=$(VM_TEST_TIMEOUT_TEST) || rc=$$?; \
	echo "make test: VM suites took $$(($$(date +%s) - s)) s, exit $$rc"; s=$$(date +%s); \
	$(MAKE) --no-print-directory e2e || rc=$$((rc | $$?)); \
	echo "make test: e2e took $$(($$(date +%s) - s)) s"; \
	if [ -s $(E2E_FAILURES) ]; then echo "===== e2e: why stories failed ($(E2E_FAILURES)) ====="; \
		cat $(E2E_FAILURES); fi; \
	exit $$rc

# The cluster's tools (e2e/build: Kubernetes, containerd, etcd, the sidecars; about half an hour
# of Go on a fresh machine) start building at once, in the background and at nice 10, so the
# host stages keep the cores first and the Go build takes what they leave (their tests and
# links leave a core idle for minutes). make e2e's own e2e/build then waits for each component
# in turn (a lock per component) and builds whatever this one did not. Its log is
# $(TEST_LOGS)/e2e-prebuild.log; a failure here is only a slower e2e stage, which reports it.
e2e-prebuild:
	@mkdir -p $(TEST_LOGS)
	@if command -v go >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		E2E_WITH_UPSTREAM=$$([ "$${E2E_UPSTREAM:-quick}" = 0 ] || echo 1) \
			nice -n 10 e2e/build >$(TEST_LOGS)/e2e-prebuild.log 2>&1 </dev/null & \
		echo "e2e-prebuild: building the cluster's tools in the background ($(TEST_LOGS)/e2e-prebuild.log)"; \
	fi

# The release build (whole-program LTO in one codegen unit: its last two minutes are one
# thread) starts at once in the background, beside the debug builds and host tests that
# follow; image-programs' own `cargo build --release` then waits on cargo's lock and finds it
# done. Its log is $(TEST_LOGS)/release-prebuild.log; a failure shows again there.
release-prebuild:
	@mkdir -p $(TEST_LOGS)
	@nice -n 5 $(CARGO) build --release --locked --bin localvol >$(TEST_LOGS)/release-prebuild.log 2>&1 </dev/null & \
		echo "release-prebuild: building the release binary in the background ($(TEST_LOGS)/release-prebuild.log)"

# The image root's programs (vm/image-lifecycle's first checks, IMAGE_PROGRAMS_ONLY=1) in a
# chroot on this host (its own mount namespace, for lvm's /proc and /sys); no VM. The release
# binary's symbol order is reported, not enforced: the list names functions as one rustc and
# one source tree hash them, so any compiler bump or refactor lowers the share found until
# `make symbol-order` regenerates it (as root, with valgrind). A stale list costs idle RSS
# (docs/performance.md), not correctness.
image-programs:
	vm/setup
	@set -eu; \
	root=$$(vm/image-root); \
	$(CARGO) build --release --locked --bin localvol; \
	programs=$$($(BIN) config programs); \
	cli/symbol-order check $(BIN) || echo "image-programs: the symbol order list is stale (advisory; make symbol-order regenerates it)"; \
	IMAGE_PROGRAMS_ONLY=1 LVM_SUPPRESS_FD_WARNINGS=1 unshare -m sh -c \
		'mount -t proc proc "$$0/proc" && mount -t sysfs sysfs "$$0/sys" && exec chroot "$$0" /bin/bash -s -- "$$@"' \
		"$$root" $$programs <vm/image-lifecycle

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The fake API server of the unit tests records the RBAC needs of the calls it serves
# (src/k8s/fake/needs.rs); deploy/rbac-needs.txt is their sorted set, which deploy/validate
# holds the chart's own roles to. Each test fails on a need the file lacks; `unit` also fails
# when the file lists a need no test makes any more. `make rbac-needs` rewrites it.
RBAC_RAW := $(CURDIR)/target/rbac-needs.raw
RBAC_NEEDS = { grep '^\#' deploy/rbac-needs.txt; LC_ALL=C sort -u $(RBAC_RAW); }
unit:
	@mkdir -p target && rm -f $(RBAC_RAW)
	LOCALVOL_RBAC_RECORD=$(RBAC_RAW) $(CARGO) test --workspace --exclude sanity-tests
	@$(RBAC_NEEDS) | diff -u deploy/rbac-needs.txt - || \
		{ echo "unit: deploy/rbac-needs.txt is not what the tests need (make rbac-needs, then the chart)"; exit 1; }

rbac-needs:
	@mkdir -p target && rm -f $(RBAC_RAW)
	LOCALVOL_RBAC_RECORD=$(RBAC_RAW) $(CARGO) test -p localvol --lib
	@$(RBAC_NEEDS) >target/rbac-needs.txt && mv target/rbac-needs.txt deploy/rbac-needs.txt

# The conformance suite starts the real binary; mount tests need root. Two test binaries
# (sanity-tests/tests/{host,vm}/main.rs, one module per area): `host` runs here, in two
# passes: first every module but the two that must be alone, their tests in parallel;
# then `bench` (its node-scale scenarios compare the length of the whole host's mount
# table, which any other test's mounts change) and `fault_injection` (4 workers and 200
# driver kills: the machine's cores), one test at a time. `vm`'s own tests run in the VM
# (test-vm); on the host it runs the few of them that need no VM kernel, with the first pass.
HOST_ALONE := bench fault_injection
sanity:
	$(CARGO) build --bin localvol
	$(CARGO) test -p sanity-tests --lib --test host --test vm -- $(foreach m,$(HOST_ALONE),--skip $(m)::)
	$(CARGO) test -p sanity-tests --test host -- --test-threads=1 $(addsuffix ::,$(HOST_ALONE))

# The fault-injection suite (sanity-tests/tests/host/fault_injection.rs; `sanity`
# runs it with its defaults: dir pool, 200 kills at 4 workers; the LVM pools'
# campaign, 40 kills at 2 workers each, is in tests/vm/vm_faults.rs, run by test-vm) with larger
# counts, for as long as asked; not for CI. Kills go on until both
# SOAK_MINUTES passed and SOAK_KILLS were done, e.g.
#   make soak SOAK_MINUTES=30
#   make soak SOAK_MINUTES=0 SOAK_KILLS=5000 SOAK_CONCURRENCY=8
# A failure prints its seed; replay it with FAULT_SEED=<seed> (same counts).
SOAK_MINUTES     ?= 10
SOAK_KILLS       ?= 1000
SOAK_CONCURRENCY ?= 8
soak:
	$(CARGO) build --bin localvol
	FAULT_MINUTES=$(SOAK_MINUTES) FAULT_KILLS=$(SOAK_KILLS) FAULT_CONCURRENCY=$(SOAK_CONCURRENCY) \
		$(CARGO) test -p sanity-tests --test host -- --nocapture fault_injection::

# The CSI community's own conformance suite (kubernetes-csi/csi-test's
# csi-sanity) against a dir pool on this host, default test sizes (10 GiB, grown
# to 20 GiB: the pool is a 64 GiB tmpfs, so the host's free disk space does not
# decide the result; a dir pool refuses what its filesystem has no room for); the VM step
# runs it on the quota, thick and thin pools. Each run must end SUCCESS! with
# 0 failed and no mount left (sanity-tests/upstream/csi-sanity-run). Found as
# $CSI_SANITY, ../shared/tools/csi-sanity, or on PATH; missing, it is a failure
# under CI=true and one SKIPPED line elsewhere.
upstream-sanity:
	$(CARGO) build --bin localvol
	@set -eu; \
	mkdir -p $(CURDIR)/target; \
	dir=$$(mktemp -d $(CURDIR)/target/upstream.XXXXXX); \
	trap 'rm -rf "$$dir"' EXIT; \
	mkdir -p "$$dir/pool"; \
	if mount -t tmpfs -o size=64g,mode=0755 localvol-sanity "$$dir/pool" 2>/dev/null; then \
		trap 'umount "$$dir/pool"; rm -rf "$$dir"' EXIT; \
	else \
		echo "upstream-sanity: no tmpfs mount (not root?): the pool shares this disk, whose free space must hold csi-sanity's 10 GiB volume and its 20 GiB expansion"; \
	fi; \
	printf 'pools:\n  - name: default\n    type: dir\n    path: %s\n' "$$dir/pool" >"$$dir/pools.yaml"; \
	sanity-tests/upstream/csi-sanity-run --name host-dir --config "$$dir/pools.yaml"

# Tests that need the VM's kernel (project quotas here; device-mapper too):
# sanity-tests' `vm` test binary (tests/vm/main.rs) with --include-ignored, run once per module
# (vm_lvm, vm_quota, ...: tests/vm/vm_*.rs) so the summary shows each area's result and time
# (see vm/guest-tests), and upstream csi-sanity on a quota dir pool, a thick and a thin LVM
# pool (vm/guest-csi-sanity; CI, CSI_SANITY and CSI_SANITY_ARGS pass into the guest), all in
# one boot. VM_GROUPS=N runs them in N guests at once (vm/test-groups), for a machine with
# more cores: on 2 cores two guests took as long as one, each test 1.6-2.3 times slower. VM_TESTS
# names the modules to run, e.g. `make test-vm VM_TESTS="vm_lvm vm_wipe"`; default: every
# module of the binary (from its --list, so none can be missed; a test outside a module
# fails the target). The driver is the release build, the binary the image ships (make test
# has built it for image-programs already); under TCG it also runs faster than the debug one
# (measured: vm_lvm_index, vm_quota and vm_iolimits 122 s against 146 s). The driver and the
# test binary are copied to a private dir first, so
# a concurrent build cannot replace them under the running guest; so is csi-sanity (found
# on the host: the guest may not see ../shared, e.g. for a checkout below /tmp). The guest
# sees the host's / read-only; its /tmp is its own tmpfs. Fails if the guest does not boot
# (vm/run: 124/125).
VM_TESTS        ?=
VM_GROUPS       ?= 1
# Whole VM run, all modules (a safety net: vm/run kills the guest and exits 124).
VM_TEST_TIMEOUT ?= 2400
# The same in make test, where the cluster's Go build shares the cores (e2e-prebuild).
VM_TEST_TIMEOUT_TEST ?= 3000

# Manifests and the Helm chart, rendered and checked offline (see deploy/README.md),
# and the alert rules tested with promtool on the driver's real /metrics
# (deploy/tools/alert_tests.py; promtool: Debian package prometheus, which
# .ci/run installs; missing, a failure under CI=true, one SKIPPED line elsewhere).
validate-deploy:
	deploy/validate

# Rewrite the kustomize base's and overlays' rendered files (localvol.yaml and
# config.yaml of deploy/kubernetes/base and overlays/*) and the alerts' rules file (deploy/prometheus/localvol-alerts.yaml)
# from the Helm chart, then validate as above.
deploy-base:
	deploy/validate --write-base

test-vm:
	vm/setup
	@set -eu; \
	mkdir -p $(CURDIR)/target; \
	dir=$$(mktemp -d $(CURDIR)/target/vm-tests.XXXXXX); \
	trap 'rm -rf "$$dir"' EXIT; \
	$(CARGO) build --release --locked --bin localvol --message-format=json-render-diagnostics >"$$dir/build.json"; \
	$(CARGO) test -p sanity-tests --test vm --no-run \
		--message-format=json-render-diagnostics >"$$dir/test.json"; \
	bin=$$(grep -o '"executable":"[^"]*"' "$$dir/build.json" | cut -d'"' -f4 | grep '/localvol$$' || true); \
	vm=$$(grep -o '"executable":"[^"]*"' "$$dir/test.json" | cut -d'"' -f4); \
	[ -n "$$bin" ] || { echo "test-vm: no localvol binary was built" >&2; exit 1; }; \
	[ "$$(echo "$$vm" | wc -w)" -eq 1 ] || { echo "test-vm: expected one vm test binary, got: $$vm" >&2; exit 1; }; \
	cp "$$bin" "$$dir/localvol"; cp "$$vm" "$$dir/vm"; \
	tests=$$("$$dir/vm" --list | sed -n 's/: test$$//p'); \
	loose=$$(echo "$$tests" | grep -v '::' || true); \
	[ -z "$$loose" ] || { echo "test-vm: tests outside a module of tests/vm/ (test-vm runs modules): $$loose" >&2; exit 1; }; \
	all=$$(echo "$$tests" | sed 's/::.*//' | sort -u); \
	modules="$(VM_TESTS)"; modules=$${modules:-$$all}; \
	for m in $$modules; do \
		echo "$$all" | grep -qx "$$m" || { echo "test-vm: no module $$m in the vm binary (modules: $$(echo $$all))" >&2; exit 1; }; \
	done; \
	if sanity=$$(sanity-tests/upstream/find-csi-sanity); then \
		cp "$$sanity" "$$dir/csi-sanity"; export CSI_SANITY="$$dir/csi-sanity"; \
	fi; \
	start=$$(date +%s); \
	rc=0; \
	LOCALVOL_BIN="$$dir/localvol" VM_PASS_ENV="LOCALVOL_BIN RUST_LOG CI CSI_SANITY CSI_SANITY_ARGS" \
		vm/test-groups $(VM_GROUPS) $(VM_TEST_TIMEOUT) "$$dir/vm" $$modules || rc=$$?; \
	echo "test-vm: VM runs took $$(($$(date +%s) - start)) s, exit $$rc"; \
	exit $$rc

# localvol on a real Kubernetes cluster built from upstream source (e2e/README.md): the
# control plane on this host, the node in the VM, the driver installed with its Helm chart,
# the user stories of e2e/stories/ driven through kubectl only. Ends with one line
# `e2e: N passed, M failed[, K skipped (...)]`: every story, m unless E2E_LOAD=0, and u (14
# specs of Kubernetes' External Storage suite, e2e/upstream/quick.txt) unless E2E_UPSTREAM=0
# (E2E_UPSTREAM=subset: the 51 of e2e/upstream/subset.txt). E2E_STORIES="b-dir-quota
# c-lvm-data" runs some of them.
E2E_STORIES ?=
e2e:
	vm/setup
	e2e/run $(E2E_STORIES)

# Kubernetes' own storage e2e suite on the same cluster (story u, e2e/upstream/README.md): every
# External Storage spec of e2e.test for each localvol class (driver definitions in
# e2e/upstream/*.yaml), those neither [Disruptive] nor [Serial] in ginkgo's parallel mode, then
# those serially; one line of counts per class and part. E2E_UPSTREAM_CLASSES="thin" picks classes.
e2e-upstream:
	vm/setup
	E2E_UPSTREAM=full e2e/run u-upstream

# The container image's userland, without a container engine: vm/image-root builds the
# Dockerfile runtime stage's root filesystem (mmdebstrap --variant=minbase of its Debian suite
# with the package list vm/image-packages reads from the Dockerfile; cached by that list in
# /var/cache/localvol-image), and in one vm/run boot vm/guest-image chroots into it with the
# release binary at /usr/local/bin/localvol and runs vm/image-lifecycle there: the programs
# the driver runs (`localvol config programs`: src/command.rs's PROGRAMS, which
# tests/architecture.rs holds to every Cmd::new) and lvm's thin_check are present, a
# thin-pool activation runs thin_check, and a dir, a thick (ext4) and a thin (xfs) pool go
# through create, stage, publish, write, expand, snapshot and restore (LVM), and delete, and
# so does an encrypted (LUKS2) volume of the thick pool.
# The binary is copied to a private dir first (a concurrent build cannot replace it).
IMAGE_TEST_TIMEOUT ?= 900
test-image: image-programs
	@set -eu; \
	mkdir -p $(CURDIR)/target; \
	dir=$$(mktemp -d $(CURDIR)/target/image-test.XXXXXX); \
	trap 'rm -rf "$$dir"' EXIT; \
	root=$$(vm/image-root); \
	cp $(BIN) "$$dir/localvol"; \
	programs=$$("$$dir/localvol" config programs); \
	start=$$(date +%s); \
	rc=0; \
	VM_PASS_ENV="RUST_LOG" vm/run --mem 1536 --timeout $(IMAGE_TEST_TIMEOUT) -- \
		vm/guest-image "$$root" "$$dir/localvol" $$programs || rc=$$?; \
	echo "test-image: VM run took $$(($$(date +%s) - start)) s, exit $$rc"; \
	exit $$rc

# LVM volume lifecycles in the VM: localvol (thick and thin pool) beside the bare
# lvcreate + mkfs + mount floor (`localvol bench --floor-lvm`), one JSON line per
# run (see vm/bench-lvm), and a thick pool's delete latency and wipe throughput. BENCH_VOLUMES,
# BENCH_CONCURRENCY, BENCH_ROUNDS, BENCH_FS, BENCH_WIPE_VOLUMES, BENCH_WIPE_SIZE,
# BENCH_POOLS and RUST_LOG pass through, e.g.
#   make bench-vm BENCH_VOLUMES=16 BENCH_FS="ext4 xfs"
#   make bench-vm BENCH_POOLS="thick thick-luks" BENCH_ROUNDS=3   # encryption's cost
# The binary and the script are copied to a private dir first (a concurrent build
# or edit cannot change them under the running guest). Slow: TCG emulation.
BENCH_VM_TIMEOUT ?= 3600
# The VM benchmarks' one recipe: `$(call vm-bench,TARGET,SCRIPT,MEM,ENV)` copies the release
# binary and vm/SCRIPT to a private dir, runs SCRIPT in the guest with MEM MB of memory and the
# environment variables named in ENV passed in, and says how long the VM run took.
define vm-bench
vm/setup
@set -eu; \
mkdir -p $(CURDIR)/target; \
dir=$$(mktemp -d $(CURDIR)/target/vm-$(1).XXXXXX); \
trap 'rm -rf "$$dir"' EXIT; \
$(CARGO) build --release --locked --bin localvol; \
cp $(BIN) vm/$(2) "$$dir/"; \
start=$$(date +%s); \
rc=0; \
VM_PASS_ENV="$(4)" \
	vm/run --mem $(3) --timeout $(BENCH_VM_TIMEOUT) -- "$$dir/$(2)" "$$dir/localvol" || rc=$$?; \
echo "$(1): VM run took $$(($$(date +%s) - start)) s, exit $$rc" >&2; \
exit $$rc
endef
bench-vm:
	$(call vm-bench,bench-vm,bench-lvm,2048,BENCH_VOLUMES BENCH_CONCURRENCY BENCH_ROUNDS BENCH_FS BENCH_POOLS BENCH_WIPE_VOLUMES BENCH_WIPE_SIZE BENCH_LOG_DIR RUST_LOG)

# Changed-block tracking in the VM (docs/backups.md, "What it saves a backup"): a thin raw block
# volume of CBT_SIZE written whole, snapshotted, CBT_CHANGED percent overwritten in CBT_CHUNK
# pieces, snapshotted again, the second snapshot restored; then the restore read whole against
# only GetMetadataDelta's runs (`localvol bench changed-blocks`, driven by vm/bench-cbt), over
# CBT_ROUNDS rounds. Prints one JSON object (CBT_TABLE=1: a table). The loop VG lives in the
# guest's /tmp, a tmpfs of half its memory, and keeps every round's volume (a deleted thin
# volume's blocks are not discarded down to it): CBT_VM_MEM (MB, default 7168) must be twice
# CBT_ROUNDS × CBT_SIZE and some; vm/bench-cbt says so before it starts. E.g.
#   make bench-cbt
#   make bench-cbt CBT_SIZE=256Mi CBT_ROUNDS=1 CBT_VM_MEM=2048   # a quick look
# CBT_SEED, CBT_POOL_CHUNK, BENCH_LOG_DIR and RUST_LOG pass through too. The binary and the
# script are copied to a private dir first, as for bench-vm. Slow: TCG emulation.
CBT_VM_MEM ?= 7168
bench-cbt:
	$(call vm-bench,bench-cbt,bench-cbt,$(CBT_VM_MEM),CBT_SIZE CBT_CHANGED CBT_CHUNK CBT_ROUNDS CBT_SEED CBT_POOL_CHUNK CBT_TABLE BENCH_LOG_DIR RUST_LOG)

bench: build
	@echo "Start the driver, then: $(BIN) bench --endpoint unix://$(SOCKET) --volumes 2000 --concurrency 4"
	@echo "Drivers side by side (lifecycles/s, peak and idle RSS; root): cli/bench-compare --help"

# Rewrite cli/symbol-order.txt, the link order of the functions a serving driver
# runs (read by cli/build.rs), from a profile of this tree's release build: after
# a compiler or dependency update, or when make test's image-programs says it is stale.
# Needs root and valgrind; about a minute.
symbol-order: build
	cli/symbol-order generate $(BIN)
	$(CARGO) build --release --locked --bin localvol
	cli/symbol-order check $(BIN)

# For users with a container engine (none runs on the CI machines).
image:
	docker build -t $(IMAGE) .

clean:
	$(CARGO) clean

# The e2e cluster's programs and images, built from upstream source (cached outside the
# checkout; prints the directory that holds them; see e2e/README.md).
e2e-build:
	@e2e/build
