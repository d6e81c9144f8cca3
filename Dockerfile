# warmwatch sidecar image:
#
#   docker build -t warmwatch:dev .
#
# Small: a multi-stage build; the final image is the Python base and one virtualenv (no
# compiler, no pip cache). Reproducible: the runtime dependencies are installed from
# requirements.lock (exact versions, `make lock`) with --no-deps, then warmwatch itself.
# Runs as a non-root user and with a read-only root filesystem: the bytecode is compiled at
# build time (PYTHONDONTWRITEBYTECODE keeps Python from trying at run time), and the only
# writes — the SQLite database, its WAL, SQLite's temporary files — go to the cache volume.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/warmwatch
COPY requirements.lock /src/
RUN /opt/warmwatch/bin/pip install --no-deps -r /src/requirements.lock
COPY pyproject.toml README.md /src/
COPY proxy /src/proxy
RUN /opt/warmwatch/bin/pip install --no-deps /src \
 && /opt/warmwatch/bin/pip uninstall --yes pip \
 && /opt/warmwatch/bin/python -m compileall -q /opt/warmwatch

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/warmwatch /opt/warmwatch
# The cache lives on a volume so that it survives container restarts (see deploy/).
RUN install -d -o 65532 -g 65532 -m 0750 /var/lib/warmwatch
VOLUME /var/lib/warmwatch
ENV PATH=/opt/warmwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SQLITE_TMPDIR=/var/lib/warmwatch \
    WARMWATCH_DB=/var/lib/warmwatch/cache.db \
    WARMWATCH_LISTEN=127.0.0.1:8001 \
    WARMWATCH_METRICS_LISTEN=0.0.0.0:9090
USER 65532:65532
EXPOSE 9090
ENTRYPOINT ["warmwatch"]
