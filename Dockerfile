# Multi-stage build: the same `cargo build --release --bin localvol` the tests use.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY sanity-tests sanity-tests
RUN cargo build --release --locked --bin localvol

FROM debian:bookworm-slim
# Tools the node plugin runs: mkfs/resize for filesystems, lvm2 for LVM pools,
# util-linux for blkid. The node plugin must run privileged (it mounts).
RUN apt-get update \
 && apt-get install -y --no-install-recommends e2fsprogs xfsprogs lvm2 util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/localvol /usr/local/bin/localvol
ENTRYPOINT ["/usr/local/bin/localvol"]
CMD ["serve"]
