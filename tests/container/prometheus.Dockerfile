# Prometheus from Debian's package on the base kiln's CPU image uses: scripts/container-test's
# stand-in for prom/prometheus, which it cannot pull (no registry). The same paths, user and
# command as the upstream image, so deploy/docker-compose.yml's mounts work unchanged.
FROM debian:12-slim
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o nobody -g nogroup /prometheus
USER nobody
EXPOSE 9090
VOLUME ["/prometheus"]
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
