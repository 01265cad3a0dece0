# Rendered by build-env for target cpu-arm64 (linux/arm64). Do not edit by hand:
# change matrix.yaml and run `build-env render --target cpu-arm64`.
# matrix entry sha256:bb186cb85d139a16dd631cbf7fbed2058850efa14f6d622b6c1232b302b5a55a, lock sha256:a5862e1feead2bbed7b8a03e355f4f499f4d13e2f9b79ddecc36328fdcaa1555

# ---------------------------------------------------------------------------- byte code
# The build machine's own python3.11 (base.bytecode_image, for the platform that builds):
# the runtime stage's install steps mount this stage and byte-compile what they installed with
# it, natively, not with the image's interpreter (emulated where the image is for another
# architecture). Nothing of this stage is shipped.
FROM --platform=$BUILDPLATFORM verl-env-test/debian:bookworm AS bytecode
ARG SOURCE_DATE_EPOCH=315532800
ARG PYC_INVALIDATION_MODE=CHECKED_HASH
COPY bytecode/compile.py /opt/verl-env-bytecode/compile.py
RUN command -v python3.11 >/dev/null \
    || { echo 'bytecode: verl-env-test/debian:bookworm has no python3.11 on PATH (base.bytecode_image)' >&2; exit 1; }; \
    python3.11 -I -S /opt/verl-env-bytecode/compile.py --launcher /opt/verl-env-bytecode/python --mount /tmp/verl-env-native

# ---------------------------------------------------------------------------- source builds
# Built in their own stage (compilers stay here); the final stage mounts only the wheels. Only
# the torch layer and the build tools are installed here: extensions compile against torch, and
# every other layer would be a second install of it (minutes under emulation). Nothing here is
# byte-compiled: no file of this stage is shipped, and the build compiles only what it imports
# (byte-compiling torch's every module took minutes under emulation).
FROM verl-env-test/debian-arm64:bookworm AS source-build
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
    && apt-get install -y --no-install-recommends ca-certificates python3.11 python3.11-venv build-essential git procps python3.11-dev \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/ldconfig/aux-cache /var/log/apt/* \
              /var/log/dpkg.log /var/log/alternatives.log

COPY layers/00-tools.txt /opt/verl-env/layers/
RUN --mount=type=bind,from=bytecode,target=/tmp/verl-env-native python3.11 -m venv --without-pip /opt/venv \
    && pip_wheel=$(/opt/venv/bin/python -c 'import glob, os, sys, sysconfig; import ensurepip as e; d = [sysconfig.get_config_var("WHEEL_PKG_DIR") or "", "/usr/share/python-wheels", os.path.join(os.path.dirname(e.__file__), "_bundled")]; w = [sorted(g)[-1] for x in d if x for g in [glob.glob(os.path.join(x, "pip-*.whl"))] if g]; print(w[0]) if w else sys.exit("ensurepip has no pip for this interpreter in " + str(d))') \
    && /opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --no-deps --require-hashes -r /opt/verl-env/layers/00-tools.txt \
    && uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --no-index --find-links "${pip_wheel%/*}" pip \
    && /tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 /opt/venv/lib/python3.11/site-packages \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock
COPY layers/10-torch.txt /opt/verl-env/layers/
RUN \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --require-hashes -r /opt/verl-env/layers/10-torch.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock
COPY layers/build-tools.txt /opt/verl-env/layers/
RUN \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --require-hashes -r /opt/verl-env/layers/build-tools.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock
# One stage per source package below, so a change to one rebuilds only its own wheel (BuildKit
# builds the stages side by side); each has its own pip cache, keyed by what its wheel is built
# against. No build isolation (it must compile against the torch of this very lock); sources
# carry no .git, so setuptools-scm is told each version; CMake finds pybind11 through its own
# cmake dir.

# verl-env-ext 0.1.0: a directory (tree sha256:2aedc5a3ca7b7a0e2c5bab53117e445d034e2ecb840e8a82151e85035fb5e971)
FROM source-build AS source-verl-env-ext
COPY source/verl-env-ext/ /tmp/verl-env/source/verl-env-ext/
RUN --mount=type=cache,id=verl-env-src-verl-env-ext-36d5cd693496,target=/root/.cache/pip \
    SOURCE_DATE_EPOCH=315532800 \
    pybind11_DIR="$(/opt/venv/bin/python -m pybind11 --cmakedir)" \
    SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VERL_ENV_EXT=0.1.0 \
    /opt/venv/bin/pip wheel --no-deps --no-build-isolation --no-binary :all: -w /wheels /tmp/verl-env/source/verl-env-ext

# ---------------------------------------------------------------------------- runtime image
FROM verl-env-test/debian-arm64:bookworm AS runtime
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
RUN --mount=type=bind,from=bytecode,target=/tmp/verl-env-native python3.11 -m venv --without-pip /opt/venv \
    && pip_wheel=$(/opt/venv/bin/python -c 'import glob, os, sys, sysconfig; import ensurepip as e; d = [sysconfig.get_config_var("WHEEL_PKG_DIR") or "", "/usr/share/python-wheels", os.path.join(os.path.dirname(e.__file__), "_bundled")]; w = [sorted(g)[-1] for x in d if x for g in [glob.glob(os.path.join(x, "pip-*.whl"))] if g]; print(w[0]) if w else sys.exit("ensurepip has no pip for this interpreter in " + str(d))') \
    && /opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --no-deps --require-hashes -r /opt/verl-env/layers/00-tools.txt \
    && uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --no-index --find-links "${pip_wheel%/*}" pip \
    && /tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 /opt/venv/lib/python3.11/site-packages \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# torch: 9 packages
COPY layers/10-torch.txt /opt/verl-env/layers/
RUN --mount=type=bind,from=bytecode,target=/tmp/verl-env-native \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --require-hashes -r /opt/verl-env/layers/10-torch.txt \
    && /tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 /opt/venv/lib/python3.11/site-packages \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# deps: 16 packages
COPY layers/30-deps.txt /opt/verl-env/layers/
RUN --mount=type=bind,from=bytecode,target=/tmp/verl-env-native \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --require-hashes -r /opt/verl-env/layers/30-deps.txt \
    && /tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 /opt/venv/lib/python3.11/site-packages \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# source-built: verl-env-ext (wheels mounted from
# their build stages, never copied into a layer)
RUN --mount=type=bind,from=source-verl-env-ext,source=/wheels,target=/tmp/verl-env/built/verl-env-ext --mount=type=bind,from=bytecode,target=/tmp/verl-env-native \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps /tmp/verl-env/built/*/*.whl \
    && /tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 /opt/venv/lib/python3.11/site-packages \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# The gate: the self-test that verify, apptainer exec and srun run inside this image.
COPY selftest/ /opt/verl-env/verl_env_selftest/
COPY manifest.json /opt/verl-env/manifest.json
RUN --mount=type=bind,from=bytecode,target=/tmp/verl-env-native echo /opt/verl-env > /opt/venv/lib/python3.11/site-packages/verl-env.pth \
    && /tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 /opt/verl-env

LABEL org.opencontainers.image.description="arm64 CPU fixture (QEMU-emulated on x86_64 hosts) with a source-built C++ extension" \
      org.opencontainers.image.title="verl-env cpu-arm64" \
      org.verl-env.accelerator="cpu" \
      org.verl-env.arch="aarch64" \
      org.verl-env.base="verl-env-test/debian-arm64:bookworm" \
      org.verl-env.builder="0.1.0" \
      org.verl-env.lock-hash="sha256:a5862e1feead2bbed7b8a03e355f4f499f4d13e2f9b79ddecc36328fdcaa1555" \
      org.verl-env.matrix-hash="sha256:bb186cb85d139a16dd631cbf7fbed2058850efa14f6d622b6c1232b302b5a55a" \
      org.verl-env.override="false" \
      org.verl-env.pin.ray="2.60.0" \
      org.verl-env.pin.torch="2.8.0" \
      org.verl-env.pin.verl-env-ext="0.1.0 (source)" \
      org.verl-env.python="3.11" \
      org.verl-env.source.verl-env-ext="tree sha256:2aedc5a3ca7b7a0e2c5bab53117e445d034e2ecb840e8a82151e85035fb5e971" \
      org.verl-env.target="cpu-arm64"
