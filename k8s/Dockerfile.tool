# The tool image of `reproci matrix --format k8s` (docs/kubernetes.md): reproci's library tree
# at /opt/reproci/lib, which each cell's init container copies into its pod (the toolchain
# images hold python3, torch and numpy, not reproci's CLI libraries), and a python3 with numpy
# at /opt/venv that runs the merge Job and the reader pod.
#
# Built by k8s/build-tool-image.sh with BuildKit; the build context is the wheelhouse
# .cache/wheelhouse/tool (reproci's wheel, the pinned wheels of tool-lib.txt and tool-venv.txt,
# and those two files), bind-mounted for the install step only. Nothing comes from the network.
# Not under docker/ on purpose: a change there rebuilds and re-proves the CUDA image in CI.
ARG BASE_IMAGE=reproci/base-bookworm:1
FROM ${BASE_IMAGE}

ENV LANG=C.UTF-8 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/reproci/lib \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN --mount=type=bind,target=/wheels \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-index --find-links /wheels \
        --only-binary=:all: --require-hashes -r /wheels/tool-venv.txt \
 && /opt/venv/bin/python -m pip install --no-index --find-links /wheels --no-deps \
        --only-binary=:all: --require-hashes --target /opt/reproci/lib -r /wheels/tool-lib.txt \
 && /opt/venv/bin/python -m pip install --no-index --no-deps --target /opt/reproci/lib /wheels/reproci-*.whl \
 && find /opt/reproci/lib -name '*.so' -delete \
 && rm -rf /opt/reproci/lib/bin \
 && chmod -R a+rX /opt/venv /opt/reproci \
 && python3 -m reproci.cli --version

USER 1000:1000
WORKDIR /tmp

ARG BASE_IMAGE
ARG IMAGE_TAG=reproci/tool:0.1.0
LABEL org.opencontainers.image.title="reproci tool" \
      org.opencontainers.image.description="reproci's library tree for the pods of reproci matrix --format k8s" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.version="${IMAGE_TAG}"
