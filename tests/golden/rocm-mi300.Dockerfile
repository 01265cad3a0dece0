# Rendered by build-env for target rocm-mi300 (linux/amd64). Do not edit by hand:
# change matrix.yaml and run `build-env render --target rocm-mi300`.
# matrix entry sha256:f269bcb83340613f752e1ce1e9afcf0264eb5692f35e0cf2571ce56c1aeedbcb, lock sha256:8cecc2d6ef895366efb69c9b87c8d7d5d50d19125ff0298a4ee3dfd1cf824e98

# ---------------------------------------------------------------------------- runtime image
FROM rocm/vllm:rocm10.0.0_ubuntu24.04_py3.12_pytorch_2.12.0_vllm_0.27.0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1
# System packages: the interpreter and the RDMA user-space NCCL needs (libibverbs/librdmacm);
# without them NCCL silently falls back to sockets. Versions: those of the base image's suite
# (the base is pinned by digest), hence no per-package apt pins.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3.12 python3.12-venv ibverbs-providers libibverbs1 libnuma1 librdmacm1 procps \
    && rm -rf /var/lib/apt/lists/*

COPY layers/00-tools.txt /opt/verl-env/layers/
RUN python3.12 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps --require-hashes -r /opt/verl-env/layers/00-tools.txt \
    && /opt/venv/bin/python -m pip uninstall -y -q setuptools

# deps: 118 packages
COPY layers/30-deps.txt /opt/verl-env/layers/
RUN --mount=type=cache,id=verl-env-uv,target=/root/.cache/uv \
    uv pip install --python /opt/venv/bin/python --link-mode=copy --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/30-deps.txt

# verl: 1 packages
COPY layers/40-verl.txt /opt/verl-env/layers/
RUN --mount=type=cache,id=verl-env-uv,target=/root/.cache/uv \
    uv pip install --python /opt/venv/bin/python --link-mode=copy --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/40-verl.txt

# The gate: the self-test that verify, apptainer exec and srun run inside this image.
COPY selftest/ /opt/verl-env/verl_env_selftest/
COPY manifest.json /opt/verl-env/manifest.json
RUN echo /opt/verl-env > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/verl-env.pth" \
    && /opt/venv/bin/python -m compileall -q /opt/verl-env

LABEL org.opencontainers.image.description="AMD MI300 (gfx942), ROCm 10.0.0; torch and vLLM come from the ROCm base image" \
      org.opencontainers.image.title="verl-env rocm-mi300" \
      org.verl-env.accelerator="rocm" \
      org.verl-env.arch="x86_64" \
      org.verl-env.base="rocm/vllm:rocm10.0.0_ubuntu24.04_py3.12_pytorch_2.12.0_vllm_0.27.0" \
      org.verl-env.builder="0.1.0" \
      org.verl-env.lock-hash="sha256:8cecc2d6ef895366efb69c9b87c8d7d5d50d19125ff0298a4ee3dfd1cf824e98" \
      org.verl-env.matrix-hash="sha256:f269bcb83340613f752e1ce1e9afcf0264eb5692f35e0cf2571ce56c1aeedbcb" \
      org.verl-env.override="false" \
      org.verl-env.pin.hydra-core="1.3.2" \
      org.verl-env.pin.ray="2.60.0" \
      org.verl-env.pin.tensordict="0.10.0" \
      org.verl-env.pin.transformers="5.10.4" \
      org.verl-env.pin.verl="0.9.1" \
      org.verl-env.provided.torch="2.12.0" \
      org.verl-env.provided.vllm="0.27.0" \
      org.verl-env.python="3.12" \
      org.verl-env.rocm="10.0.0" \
      org.verl-env.target="rocm-mi300"
