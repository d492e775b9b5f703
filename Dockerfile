# syntax=docker/dockerfile:1
# One image for every banditstream process: `banditstream join | learn | publish | topics create | keys generate ...`.
#
#   docker build -t banditstream:0.1.0 .
#
# The build stage compiles the C extensions that setup.py declares (the Avro codec, the
# linear policies' decision step) against the pinned dependencies of constraints.txt; the
# runtime stage gets the finished virtualenv and no compiler.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/banditstream
WORKDIR /src
COPY constraints.txt pyproject.toml setup.py README.md ./
COPY schemas/ schemas/
COPY streams/ streams/
COPY learner/ learner/
COPY publisher/ publisher/
COPY banditstream/ banditstream/
# The pip cache mount keeps downloaded wheels between builds without putting them in a layer.
# The extensions are optional at run time, so a failed compile would pass unnoticed: import each.
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/banditstream/bin/pip install -c constraints.txt '.[all]' \
    && cd / && for module in $(grep -o 'Extension("[^"]*"' /src/setup.py | cut -d'"' -f2); do \
        /opt/banditstream/bin/python -c "import ${module}" && echo "built ${module}" || exit 1; \
    done

FROM ${PYTHON_IMAGE} AS runtime
# State (RocksDB) and keys directories are owned by the user, so named volumes mounted there
# inherit that owner.
RUN groupadd --system --gid 10001 banditstream \
    && useradd --system --uid 10001 --gid banditstream --home-dir /var/lib/banditstream --shell /usr/sbin/nologin banditstream \
    && install -d -o banditstream -g banditstream -m 0750 /var/lib/banditstream /etc/banditstream/keys \
    && install -d -m 0755 /etc/banditstream
COPY --from=build /opt/banditstream /opt/banditstream
ENV PATH=/opt/banditstream/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/banditstream
ENTRYPOINT ["banditstream"]
CMD ["--help"]
