# Builds berthd without a database: sqlx reads the committed offline query data (.sqlx/).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
ENV SQLX_OFFLINE=true
RUN cargo build --release --locked -p berthd

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/berthd /usr/local/bin/berthd
USER nobody
EXPOSE 8080
ENTRYPOINT ["berthd", "serve"]
