# syntax=docker/dockerfile:1
# One image for every component: the `gpu-booking` binary (api, webhook, controller,
# agent, migrate, certs) on distroless/cc, as a numeric non-root user, nothing
# writable needed (the chart runs it with a read-only root filesystem).
#
#   docker build -t gpu-booking:0.1.0 .
#
# No database is needed to build: the queries are checked against the offline data in
# .sqlx/ (.cargo/config.toml sets SQLX_OFFLINE), migrations and the booking page's
# assets are compiled into the binary.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary is
# copied out of the cached target folder.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gpu-booking \
    && install -m 0755 target/release/gpu-booking /gpu-booking

# glibc and CA certificates, no shell, no package manager. The agent's NVML library
# (libnvidia-ml.so) is mounted at run time by the NVIDIA container runtime.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /gpu-booking /usr/local/bin/gpu-booking
# 65532 is distroless's "nonroot"; numeric so that runAsNonRoot can verify it.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-booking"]
CMD ["--help"]
