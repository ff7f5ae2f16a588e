# Multi-stage build: the same `cargo build --release --bin localvol` the tests use, with
# any current stable rustc. The link order of the hot functions (cli/symbol-order.txt) names
# them as the rustc that generated it does; with another compiler fewer are found and the
# binary idles with a few MiB more resident, nothing else (`make symbol-order` regenerates it).
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY cli cli
COPY sanity-tests sanity-tests
RUN cargo build --release --locked --bin localvol

FROM debian:bookworm-slim
# Tools the node plugin runs: mkfs.ext4/resize2fs (e2fsprogs), mkfs.xfs/xfs_growfs
# (xfsprogs), lvm (lvm2), thin_check, which lvm runs on every thin-pool
# activation (thin-provisioning-tools: lvm2 only recommends it, and without it
# lvm skips the check), blkid/wipefs/blkdiscard (util-linux), cryptsetup
# (cryptsetup-bin: the program alone, without the boot-time scripts of the
# `cryptsetup` package) for volumes encrypted at rest; dd and shred come
# with the base image. The node plugin must run privileged (it mounts).
# `make test-image` builds this stage's root filesystem from the package list
# below (vm/image-packages reads it from here) and runs the driver in it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      e2fsprogs xfsprogs lvm2 thin-provisioning-tools util-linux cryptsetup-bin \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/localvol /usr/local/bin/localvol
ENTRYPOINT ["/usr/local/bin/localvol"]
CMD ["serve"]
