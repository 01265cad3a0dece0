# Rendered by build-env for target cpu-x86_64 (linux/amd64). Do not edit by hand:
# change matrix.yaml and run `build-env render --target cpu-x86_64`.
# matrix entry sha256:1100ed98ce481a6ab7e1972fc5fa9221d7a73a54aa34bfea12ee9950b2f0a83d, lock sha256:a097e2553625da561f37ad304aa6f666695944c228b665258bc5ab5cc24b10e4

# ---------------------------------------------------------------------------- runtime image
FROM verl-env-test/debian:bookworm
ARG SOURCE_DATE_EPOCH=315532800
ARG PYC_INVALIDATION_MODE=CHECKED_HASH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# System packages: the interpreter and the RDMA user-space NCCL needs (libibverbs/librdmacm);
# without them NCCL silently falls back to sockets. Versions: those of the base image's suite
# (the base is pinned by tag only: its suite moves with the tag; add its digest to the matrix).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3.11 python3.11-venv procps \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/ldconfig/aux-cache /var/log/apt/* \
              /var/log/dpkg.log /var/log/alternatives.log

COPY layers/00-tools.txt /opt/verl-env/layers/
RUN python3.11 -m venv --without-pip /opt/venv \
    && pip_wheel=$(/opt/venv/bin/python -c 'import glob, os, sys, sysconfig; import ensurepip as e; d = [sysconfig.get_config_var("WHEEL_PKG_DIR") or "", "/usr/share/python-wheels", os.path.join(os.path.dirname(e.__file__), "_bundled")]; w = [sorted(g)[-1] for x in d if x for g in [glob.glob(os.path.join(x, "pip-*.whl"))] if g]; print(w[0]) if w else sys.exit("ensurepip has no pip for this interpreter in " + str(d))') \
    && /opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --no-deps --require-hashes -r /opt/verl-env/layers/00-tools.txt \
    && uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --no-index --find-links "${pip_wheel%/*}" pip \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# torch: 10 packages
COPY layers/10-torch.txt /opt/verl-env/layers/
RUN --mount=type=bind,source=wheels,target=/tmp/verl-env/wheels \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes --find-links /tmp/verl-env/wheels -r /opt/verl-env/layers/10-torch.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# deps: 120 packages
COPY layers/30-deps.txt /opt/verl-env/layers/
RUN --mount=type=bind,source=wheels,target=/tmp/verl-env/wheels \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes --find-links /tmp/verl-env/wheels -r /opt/verl-env/layers/30-deps.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# verl: 1 packages
COPY layers/40-verl.txt /opt/verl-env/layers/
RUN --mount=type=bind,source=wheels,target=/tmp/verl-env/wheels \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes --find-links /tmp/verl-env/wheels -r /opt/verl-env/layers/40-verl.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# The gate: the self-test that verify, apptainer exec and srun run inside this image.
COPY selftest/ /opt/verl-env/verl_env_selftest/
COPY manifest.json /opt/verl-env/manifest.json
RUN echo /opt/verl-env > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/verl-env.pth" \
    && /opt/venv/bin/python -m compileall -q /opt/verl-env

LABEL org.opencontainers.image.description="CPU-only fixture for CI (gloo, Ray, tensordict, import verl)" \
      org.opencontainers.image.title="verl-env cpu-x86_64" \
      org.verl-env.accelerator="cpu" \
      org.verl-env.arch="x86_64" \
      org.verl-env.base="verl-env-test/debian:bookworm" \
      org.verl-env.builder="0.1.0" \
      org.verl-env.lock-hash="sha256:a097e2553625da561f37ad304aa6f666695944c228b665258bc5ab5cc24b10e4" \
      org.verl-env.matrix-hash="sha256:1100ed98ce481a6ab7e1972fc5fa9221d7a73a54aa34bfea12ee9950b2f0a83d" \
      org.verl-env.override="false" \
      org.verl-env.pin.cachetools="8.0.2" \
      org.verl-env.pin.fastapi="0.165.0" \
      org.verl-env.pin.hydra-core="1.3.2" \
      org.verl-env.pin.ray="2.60.0" \
      org.verl-env.pin.tensordict="0.10.0" \
      org.verl-env.pin.torch="2.13.0+cpu" \
      org.verl-env.pin.transferqueue="0.1.11" \
      org.verl-env.pin.transformers="5.9.0" \
      org.verl-env.pin.uvicorn="0.54.0" \
      org.verl-env.pin.verl="0.9.1" \
      org.verl-env.python="3.11" \
      org.verl-env.target="cpu-x86_64"
