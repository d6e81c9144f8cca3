# warmwatch sidecar image. Build: docker build -t warmwatch:dev .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# The cache lives on a volume so that it survives container restarts (see deploy/).
VOLUME /var/lib/warmwatch
USER 65532:65532
ENV WARMWATCH_DB=/var/lib/warmwatch/cache.db \
    WARMWATCH_LISTEN=127.0.0.1:8001 \
    WARMWATCH_METRICS_LISTEN=0.0.0.0:9090
EXPOSE 9090
ENTRYPOINT ["warmwatch"]
