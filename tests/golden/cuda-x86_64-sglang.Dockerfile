# Rendered by build-env for target cuda-x86_64-sglang (linux/amd64). Do not edit by hand:
# change matrix.yaml and run `build-env render --target cuda-x86_64-sglang`.
# matrix entry sha256:9d83627092ebe170fc12ad254e7d7b7f91a82911376058c8c2353ccbed0d544b, lock sha256:fbc6cf4d2c040402199e84dd58e7a057a38d4916faf4f36213185acc1de05516

# ---------------------------------------------------------------------------- runtime image
FROM nvidia/cuda:13.0.2-base-ubuntu24.04
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

# engine: 160 packages
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

LABEL org.opencontainers.image.description="NVIDIA x86_64 with SGLang rollout (verl[sglang]), CUDA 13.0 wheels from the index" \
      org.opencontainers.image.title="verl-env cuda-x86_64-sglang" \
      org.verl-env.accelerator="cuda" \
      org.verl-env.arch="x86_64" \
      org.verl-env.base="nvidia/cuda:13.0.2-base-ubuntu24.04" \
      org.verl-env.builder="0.1.0" \
      org.verl-env.cuda="13.0" \
      org.verl-env.dep-override.transformers="5.9.0 (sglang 0.5.12 pins transformers==5.6.0, which verl 0.9.1 excludes (!=5.6.0) while its sglang extra pins 5.9.0; verl's own lock forces 5.9.0 with a project-wide override, as this does)" \
      org.verl-env.gpus="sm_80,sm_90,sm_100,sm_103,sm_120" \
      org.verl-env.lock-hash="sha256:fbc6cf4d2c040402199e84dd58e7a057a38d4916faf4f36213185acc1de05516" \
      org.verl-env.matrix-hash="sha256:9d83627092ebe170fc12ad254e7d7b7f91a82911376058c8c2353ccbed0d544b" \
      org.verl-env.override="false" \
      org.verl-env.pin.hydra-core="1.3.2" \
      org.verl-env.pin.kernels="0.12.3" \
      org.verl-env.pin.ray="2.60.0" \
      org.verl-env.pin.sglang="0.5.12" \
      org.verl-env.pin.sglang-kernel="0.4.2.post2" \
      org.verl-env.pin.tensordict="0.10.0" \
      org.verl-env.pin.torch="2.11.0" \
      org.verl-env.pin.transformers="5.9.0" \
      org.verl-env.pin.verl="0.9.1" \
      org.verl-env.python="3.12" \
      org.verl-env.target="cuda-x86_64-sglang"
