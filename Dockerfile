# kilnd and kiln in a container, in two variants from this one file:
#   docker build -t kiln:cuda .                             CUDA 13 + cuDNN 9 on Ubuntu 24.04
#   docker build -t kiln:cpu --build-arg KILN_DEVICE=cpu .  Debian 12, no CUDA (KILN_CUDA=OFF)
# The build stage runs the scripts the test command runs (scripts/install-deps, scripts/build);
# the runtime stage carries kilnd, kiln and the packages of the libraries they load, not the
# build tree. kilnd's flags come from FLAGS_<flag> environment variables (deploy/image/
# kilnd-entrypoint); arguments after the image name go to kilnd and win over them.
# Build arguments: KILN_DEVICE (cuda|cpu), CUDA_VERSION, KILN_CUDA_ARCHS (default 90: H100/H200),
# KILN_CMAKE_ARGS (e.g. -DKILN_CPU_ARCH= for CPUs older than x86-64-v3), KILN_BINARIES (below).
#
# KILN_BINARIES=source (the default) compiles kilnd, kiln-worker and kiln in the build stage.
# KILN_BINARIES=prebuilt takes them from a build made outside, on the runtime base's OS (Debian 12
# for the CPU variant), as the build context named "prebuilt": a folder that
# deploy/image/collect-binaries fills from a build tree. scripts/container-test does this with the
# binaries the test command has just built, so CI does not compile kiln twice:
#   deploy/image/collect-binaries build /tmp/kiln-binaries
#   docker build -t kiln:cpu --build-arg KILN_DEVICE=cpu --build-arg KILN_BINARIES=prebuilt \
#     --build-context prebuilt=/tmp/kiln-binaries .

ARG KILN_DEVICE=cuda
ARG CUDA_VERSION=13.0.2
ARG KILN_BINARIES=source

# ---- build bases: the CUDA toolkit with cuDNN, or plain Debian 12 (the test command's OS) ----
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu24.04 AS build-cuda
ENV KILN_CUDA=ON
FROM debian:12 AS build-cpu
ENV KILN_CUDA=OFF

# ---- build: the same package list and build script as CI; tests are not built ----
FROM build-${KILN_DEVICE} AS build
WORKDIR /src
# install-deps alone first, so this layer stays cached while the sources change.
COPY scripts/install-deps scripts/install-deps
RUN scripts/install-deps --image
COPY . .
ARG KILN_CUDA_ARCHS=90
ARG KILN_CMAKE_ARGS=
# KILN_CMAKE_ARGS is split into words on purpose: it may hold several cmake arguments.
RUN scripts/build -DKILN_CUDA="${KILN_CUDA}" -DKILN_BUILD_TESTS=OFF ${KILN_CMAKE_ARGS} \
 && deploy/image/collect-binaries build /kiln-binaries

# ---- the binaries the runtime stage takes: compiled above, or given as a build context ----
FROM scratch AS binaries-source
COPY --from=build /kiln-binaries/ /
FROM scratch AS binaries-prebuilt
COPY --from=prebuilt / /
FROM binaries-${KILN_BINARIES} AS binaries

# ---- runtime bases: the matching CUDA runtime with cuDNN, or Debian 12 slim ----
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu24.04 AS runtime-cuda
FROM debian:12-slim AS runtime-cpu

# ---- runtime: kilnd, kiln-worker (beside kilnd, where it starts them) and kiln, unprivileged ----
FROM runtime-${KILN_DEVICE} AS runtime
COPY --from=binaries /runtime-packages /tmp/kiln-image/runtime-packages
COPY deploy/image/install-runtime-packages /tmp/kiln-image/
RUN /tmp/kiln-image/install-runtime-packages /tmp/kiln-image/runtime-packages \
 && rm -rf /tmp/kiln-image \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/kiln \
      --shell /usr/sbin/nologin kiln \
 && install -d -o kiln -g kiln -m 0750 /var/lib/kiln /var/lib/kiln/state /var/lib/kiln/data
COPY --from=binaries /kilnd /kiln-worker /kiln /usr/local/bin/
COPY deploy/image/kilnd-entrypoint /usr/local/bin/

# Inside a container kilnd must listen on every interface, not on loopback (its defaults).
ENV FLAGS_listen=0.0.0.0:7070 \
    FLAGS_metrics_listen=0.0.0.0:9464 \
    FLAGS_state_dir=/var/lib/kiln/state \
    FLAGS_data_dir=/var/lib/kiln/data
# A numeric user, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# The job store, checkpoints and uploaded datasets.
VOLUME ["/var/lib/kiln"]
# gRPC (training, KServe v2, health, reflection) and Prometheus /metrics.
EXPOSE 7070 9464
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD kiln --server "127.0.0.1:${FLAGS_listen##*:}" health || exit 1
ENTRYPOINT ["kilnd-entrypoint"]
