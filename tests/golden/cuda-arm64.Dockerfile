# Rendered by build-env for target cuda-arm64 (linux/arm64). Do not edit by hand:
# change matrix.yaml and run `build-env render --target cuda-arm64`.
# matrix entry sha256:d1d9ad90e7f14d5ed3fe2562366e5c57073af14dc530d4fa446b01dffac1d8fc, lock sha256:f87adec2c2596e4213ca4e8d93a38bd1f3b2e944b880ad36d33c65827e21a733

# ---------------------------------------------------------------------------- source builds
# Built in their own stage (compilers stay here); the final stage mounts only the wheels. Only
# the torch layer and the build tools are installed here: extensions compile against torch, and
# every other layer would be a second install of it (minutes under emulation). Nothing here is
# byte-compiled: no file of this stage is shipped, and the build compiles only what it imports
# (byte-compiling torch's every module took minutes under emulation).
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04 AS source-build
ARG SOURCE_DATE_EPOCH=315532800
ARG PYC_INVALIDATION_MODE=CHECKED_HASH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# System packages: the interpreter and the RDMA user-space NCCL needs (libibverbs/librdmacm);
# without them NCCL silently falls back to sockets. Versions: those of the base image's suite
# (the base is pinned by tag only: its suite moves with the tag; add its digest to the matrix).
# The interpreter's shared library (the matrix's shared_libpython), under the name the base's
# suite gives it: libpython3.12t64 after Ubuntu 24.04's 64-bit time_t transition, else
# libpython3.12; a suite without either stops the build here, naming it.
# hadolint ignore=DL3008
RUN apt-get update \
    && libpython=$(apt-cache pkgnames libpython3.12 | grep -xE 'libpython3\.12(t64)?' | sort | tail -n 1 || true) \
    && { [ -n "$libpython" ] || { echo "no libpython3.12 package in the base's apt sources (shared_libpython)" >&2; exit 100; }; } \
    && apt-get install -y --no-install-recommends ca-certificates python3.12 python3.12-venv build-essential git ibverbs-providers libibverbs1 libnuma1 librdmacm1 procps python3.12-dev "$libpython" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/ldconfig/aux-cache /var/log/apt/* \
              /var/log/dpkg.log /var/log/alternatives.log

COPY layers/00-tools.txt /opt/verl-env/layers/
RUN python3.12 -m venv --without-pip /opt/venv \
    && pip_wheel=$(/opt/venv/bin/python -c 'import glob, os, sys, sysconfig; import ensurepip as e; d = [sysconfig.get_config_var("WHEEL_PKG_DIR") or "", "/usr/share/python-wheels", os.path.join(os.path.dirname(e.__file__), "_bundled")]; w = [sorted(g)[-1] for x in d if x for g in [glob.glob(os.path.join(x, "pip-*.whl"))] if g]; print(w[0]) if w else sys.exit("ensurepip has no pip for this interpreter in " + str(d))') \
    && /opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --no-deps --require-hashes -r /opt/verl-env/layers/00-tools.txt \
    && uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --no-index --find-links "${pip_wheel%/*}" pip \
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
# cmake dir. GPU code is compiled for the target's gpus (sm_90, sm_100, sm_103): there is
# no GPU to detect on a build host.

# tensordict 0.10.0: https://github.com/pytorch/tensordict v0.10.0, commit c34264a58b12471dc3e2913ea586b32431872d4c
FROM source-build AS source-tensordict
COPY source/tensordict/ /tmp/verl-env/source/tensordict/
RUN --mount=type=cache,id=verl-env-src-tensordict-3a43828fd48c,target=/root/.cache/pip \
    SOURCE_DATE_EPOCH=315532800 \
    pybind11_DIR="$(/opt/venv/bin/python -m pybind11 --cmakedir)" \
    TORCH_CUDA_ARCH_LIST="9.0;10.0;10.3" \
    SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TENSORDICT=0.10.0 \
    /opt/venv/bin/pip wheel --no-deps --no-build-isolation --no-binary :all: -w /wheels /tmp/verl-env/source/tensordict

# flash-attn 2.8.3: its sdist on the index (sha256:1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d), hash-checked
# flash-attn: FLASH_ATTENTION_FORCE_BUILD (its setup.py would otherwise download an unhashed
# prebuilt wheel), for the target's gpus, with as many jobs as the build host's memory allows
# (about 9 GB each).
FROM source-build AS source-flash-attn
COPY source/flash-attn.txt /tmp/verl-env/source/
RUN --mount=type=cache,id=verl-env-src-flash-attn-4f16e4b12d3d,target=/root/.cache/pip \
    SOURCE_DATE_EPOCH=315532800 \
    pybind11_DIR="$(/opt/venv/bin/python -m pybind11 --cmakedir)" \
    TORCH_CUDA_ARCH_LIST="9.0;10.0;10.3" \
    SETUPTOOLS_SCM_PRETEND_VERSION_FOR_FLASH_ATTN=2.8.3 \
    FLASH_ATTENTION_FORCE_BUILD=TRUE \
    FLASH_ATTN_CUDA_ARCHS="90;100" \
    MAX_JOBS="${MAX_JOBS:-$(awk '/MemAvailable/ {n = int($2 / 9437184); print (n > 0 ? n : 1)}' /proc/meminfo)}" \
    /opt/venv/bin/pip wheel --no-deps --no-build-isolation --no-binary :all: --require-hashes -w /wheels -r /tmp/verl-env/source/flash-attn.txt

# ---------------------------------------------------------------------------- runtime image
FROM nvidia/cuda:13.0.2-base-ubuntu24.04 AS runtime
ARG SOURCE_DATE_EPOCH=315532800
ARG PYC_INVALIDATION_MODE=CHECKED_HASH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# System packages: the interpreter and the RDMA user-space NCCL needs (libibverbs/librdmacm);
# without them NCCL silently falls back to sockets. Versions: those of the base image's suite
# (the base is pinned by tag only: its suite moves with the tag; add its digest to the matrix).
# The interpreter's shared library (the matrix's shared_libpython), under the name the base's
# suite gives it: libpython3.12t64 after Ubuntu 24.04's 64-bit time_t transition, else
# libpython3.12; a suite without either stops the build here, naming it.
# hadolint ignore=DL3008
RUN apt-get update \
    && libpython=$(apt-cache pkgnames libpython3.12 | grep -xE 'libpython3\.12(t64)?' | sort | tail -n 1 || true) \
    && { [ -n "$libpython" ] || { echo "no libpython3.12 package in the base's apt sources (shared_libpython)" >&2; exit 100; }; } \
    && apt-get install -y --no-install-recommends ca-certificates python3.12 python3.12-venv ibverbs-providers libibverbs1 libnuma1 librdmacm1 procps "$libpython" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/ldconfig/aux-cache /var/log/apt/* \
              /var/log/dpkg.log /var/log/alternatives.log

COPY layers/00-tools.txt /opt/verl-env/layers/
RUN python3.12 -m venv --without-pip /opt/venv \
    && pip_wheel=$(/opt/venv/bin/python -c 'import glob, os, sys, sysconfig; import ensurepip as e; d = [sysconfig.get_config_var("WHEEL_PKG_DIR") or "", "/usr/share/python-wheels", os.path.join(os.path.dirname(e.__file__), "_bundled")]; w = [sorted(g)[-1] for x in d if x for g in [glob.glob(os.path.join(x, "pip-*.whl"))] if g]; print(w[0]) if w else sys.exit("ensurepip has no pip for this interpreter in " + str(d))') \
    && /opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --no-deps --require-hashes -r /opt/verl-env/layers/00-tools.txt \
    && uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --no-index --find-links "${pip_wheel%/*}" pip \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# torch: 29 packages
COPY layers/10-torch.txt /opt/verl-env/layers/
RUN \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/10-torch.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# engine: 165 packages
COPY layers/20-engine.txt /opt/verl-env/layers/
RUN \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/20-engine.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# deps: 65 packages
COPY layers/30-deps.txt /opt/verl-env/layers/
RUN \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/30-deps.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# source-built: tensordict, flash-attn (wheels mounted from
# their build stages, never copied into a layer)
RUN --mount=type=bind,from=source-tensordict,source=/wheels,target=/tmp/verl-env/built/tensordict --mount=type=bind,from=source-flash-attn,source=/wheels,target=/tmp/verl-env/built/flash-attn \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode /tmp/verl-env/built/*/*.whl \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# verl: 1 packages
COPY layers/40-verl.txt /opt/verl-env/layers/
RUN \
    uv pip install --python /opt/venv/bin/python --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/40-verl.txt \
    && find /opt/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'sed -i "/\.dist-info\/uv_cache\.json,/d" "${1%/*}/RECORD" && rm "$1"' sh {} \; \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# The gate: the self-test that verify, apptainer exec and srun run inside this image.
COPY selftest/ /opt/verl-env/verl_env_selftest/
COPY manifest.json /opt/verl-env/manifest.json
RUN echo /opt/verl-env > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/verl-env.pth" \
    && /opt/venv/bin/python -m compileall -q /opt/verl-env

LABEL org.opencontainers.image.description="NVIDIA Grace (GH200/GB200), aarch64, CUDA 13.0; tensordict built from source" \
      org.opencontainers.image.title="verl-env cuda-arm64" \
      org.verl-env.accelerator="cuda" \
      org.verl-env.arch="aarch64" \
      org.verl-env.base="nvidia/cuda:13.0.2-base-ubuntu24.04" \
      org.verl-env.builder="0.1.0" \
      org.verl-env.cuda="13.0" \
      org.verl-env.gpus="sm_90,sm_100,sm_103" \
      org.verl-env.lock-hash="sha256:f87adec2c2596e4213ca4e8d93a38bd1f3b2e944b880ad36d33c65827e21a733" \
      org.verl-env.matrix-hash="sha256:d1d9ad90e7f14d5ed3fe2562366e5c57073af14dc530d4fa446b01dffac1d8fc" \
      org.verl-env.override="false" \
      org.verl-env.pin.flash-attn="2.8.3 (source)" \
      org.verl-env.pin.hydra-core="1.3.2" \
      org.verl-env.pin.ray="2.60.0" \
      org.verl-env.pin.tensordict="0.10.0 (source)" \
      org.verl-env.pin.torch="2.11.0" \
      org.verl-env.pin.transformers="5.9.0" \
      org.verl-env.pin.verl="0.9.1" \
      org.verl-env.pin.vllm="0.24.0" \
      org.verl-env.python="3.12" \
      org.verl-env.source.flash-attn="sdist sha256:1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d" \
      org.verl-env.source.tensordict="git v0.10.0 c34264a58b12471dc3e2913ea586b32431872d4c" \
      org.verl-env.target="cuda-arm64"
