# The allocator node image: the `allocator` console script, as systemd runs it from
# /opt/allocator (deploy/systemd/allocator@.service), under a non-root user.
#
#   docker build -t allocator .
#   docker run --rm allocator config check          # ENTRYPOINT is `allocator`; CMD is `run`
#
# Configuration comes from ALLOCATOR_* variables and an optional TOML file (ALLOCATOR_CONFIG);
# deploy/compose/ shows a whole cluster. The node keeps its live ZooKeeper session in
# node.state_dir: mount a volume at /var/lib/allocator (made 0700 for the node's user here,
# which a new named volume copies) and set ALLOCATOR_NODE_STATE_DIR=/var/lib/allocator.
# Checked offline by tests/unit/test_deploy_compose.py (hadolint; USER and ENTRYPOINT).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Only what the distribution is built from (pyproject.toml lists its packages): no tests.
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY allocator ./allocator
COPY migrations ./migrations
COPY jobs ./jobs
# psycopg[binary] brings its own libpq, so the image needs no Debian packages. The source is
# named as the distribution it must build (pip refuses another name).
RUN python -m venv /opt/allocator \
    && /opt/allocator/bin/pip install --no-cache-dir --no-compile \
        "snowflake-block-allocator[node,sasl] @ file:///src"

FROM ${PYTHON_IMAGE}
# Same base image, so the venv's interpreter link (/usr/local/bin/python3.11) resolves.
COPY --from=build /opt/allocator /opt/allocator
# A fixed uid/gid, so volumes and Kubernetes' runAsNonRoot see the same numeric user.
RUN groupadd --system --gid 10001 allocator \
    && useradd --system --uid 10001 --gid allocator --no-create-home \
        --home-dir /var/lib/allocator --shell /usr/sbin/nologin allocator \
    && install -d -o allocator -g allocator -m 0700 /var/lib/allocator
ENV PATH="/opt/allocator/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/allocator
# The admin HTTP server (/metrics, /healthz, /readyz, /status) when node.admin_address is
# 0.0.0.0:8470; it binds to loopback unless configured.
EXPOSE 8470
# SIGTERM: the leader ends its term and deletes its znode, so the next node leads at once.
STOPSIGNAL SIGTERM
ENTRYPOINT ["allocator"]
CMD ["run"]
