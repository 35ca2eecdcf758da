# Dockerfile — kvseal serve on Debian bookworm (docs/operations.md "Deploying:
# Docker and systemd"). The build stage runs the README's install and build
# (scripts/install-deps.sh && make); the runtime stage holds the binary, its
# shared libraries and the shipped model, and runs as an unprivileged user.
#   docker build -t kvseal .
#   docker run --rm -p 8080:8080 kvseal --alias @cf/kvseal/kjv-mini
FROM debian:bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . /src
RUN scripts/install-deps.sh && make

FROM debian:bookworm-slim
# the runtime halves of the -dev packages scripts/install-deps.sh installs,
# and curl for the health check
RUN apt-get update && apt-get install -y --no-install-recommends \
        libpcre2-8-0 libjansson4 libmicrohttpd12 libsodium23 libxxhash0 libssl3 libsystemd0 libucx0 \
        libhiredis0.14 libcurl4 \
        curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin kvseal
# bin/kvseal finds ../models/kjv-mini.gguf by itself (cli_default_model)
COPY --from=build /src/build/kvseal /opt/kvseal/bin/kvseal
COPY models/kjv-mini.gguf /opt/kvseal/models/kjv-mini.gguf
ENV KS_MODEL=/opt/kvseal/models/kjv-mini.gguf
USER kvseal
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/health || exit 1
ENTRYPOINT ["/opt/kvseal/bin/kvseal", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD ["--log-format", "json"]
