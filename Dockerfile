# Berth's image: berthd and the dashboard it serves at /. Three stages; `scripts/image-check`
# (run by scripts/test) builds what the first two build, lays out the files as the last
# one does and checks that berthd serves the dashboard from there.

# The dashboard, with Debian's Node.js: the same script as on a development machine
# (checks the API types against openapi/openapi.json, type-checks, bundles to web/dist).
FROM debian:bookworm AS web
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY openapi/openapi.json openapi/openapi.json
COPY scripts/web-build scripts/web-build
COPY web web
RUN scripts/web-build

# berthd without a database: sqlx reads the committed offline query data (.sqlx/).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
ENV SQLX_OFFLINE=true
RUN cargo build --release --locked -p berthd

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/berthd /usr/local/bin/berthd
COPY --from=web /src/web/dist /usr/share/berth/web
ENV BERTH_WEB_DIR=/usr/share/berth/web
USER nobody
EXPOSE 8080
ENTRYPOINT ["berthd", "serve"]
