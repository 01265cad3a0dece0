# Rendered by build-env for target rocm-mi300 (linux/amd64). Do not edit by hand:
# change matrix.yaml and run `build-env render --target rocm-mi300`.
# matrix entry sha256:a94a8f06eb57f61d0cbbe0cc6dc7401ef9c24c98068d8350302c24b7f2a42a3a, lock sha256:e58473a3bb2dda76c70adcbdf048d6df79dadc5a6dd5d1edd17cad00e6442d5a

# ---------------------------------------------------------------------------- runtime image
FROM rocm/verl:verl-0.7.1.amd0_rocm7.0.2_ubuntu22.04_py3.12_vllm0.20.2@sha256:64072e02ef3fc364a0bef09e71c0f4b3ae32ba6fc65e4d121a4736a538aa2bb8
ARG SOURCE_DATE_EPOCH=315532800
ARG PYC_INVALIDATION_MODE=CHECKED_HASH
# Vendor base (declared, not yet inspected): it provides torch 2.9.1.dev20251204+rocm7.0.2, vllm 0.20.2rc1.
# Everything installs into its own interpreter (python3); nothing it holds is
# reinstalled or upgraded (those packages are not in the layers below).
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES=1 \
    RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES=1
# System packages the target adds (the base's python and libraries are its own).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ibverbs-providers libibverbs1 libnuma1 librdmacm1 procps \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/ldconfig/aux-cache /var/log/apt/* \
              /var/log/dpkg.log /var/log/alternatives.log

COPY layers/00-tools.txt /opt/verl-env/layers/
RUN python3 -m pip install --no-cache-dir --no-deps --require-hashes --target /opt/verl-env/tools -r /opt/verl-env/layers/00-tools.txt

# deps: 118 packages
COPY layers/30-deps.txt /opt/verl-env/layers/
RUN \
    /opt/verl-env/tools/bin/uv pip install --python python3 --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/30-deps.txt \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# verl: 1 packages
COPY layers/40-verl.txt /opt/verl-env/layers/
RUN \
    /opt/verl-env/tools/bin/uv pip install --python python3 --cache-dir /tmp/verl-env-uv --link-mode=hardlink --no-deps --compile-bytecode --require-hashes -r /opt/verl-env/layers/40-verl.txt \
    && rm -rf /tmp/verl-env-uv /tmp/uv-*.lock

# The gate: the self-test that verify, apptainer exec and srun run inside this image.
COPY selftest/ /opt/verl-env/verl_env_selftest/
COPY manifest.json /opt/verl-env/manifest.json
RUN echo /opt/verl-env > "$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/verl-env.pth" \
    && python3 -m compileall -q /opt/verl-env/verl_env_selftest \
    && command -v python3 > /opt/verl-env/interpreter

LABEL org.opencontainers.image.description="AMD MI300 (gfx942), ROCm 7.0.2; torch and vLLM come from AMD's verl image" \
      org.opencontainers.image.title="verl-env rocm-mi300" \
      org.verl-env.accelerator="rocm" \
      org.verl-env.arch="x86_64" \
      org.verl-env.base="rocm/verl:verl-0.7.1.amd0_rocm7.0.2_ubuntu22.04_py3.12_vllm0.20.2@sha256:64072e02ef3fc364a0bef09e71c0f4b3ae32ba6fc65e4d121a4736a538aa2bb8" \
      org.verl-env.builder="0.1.0" \
      org.verl-env.gpus="gfx942" \
      org.verl-env.lock-hash="sha256:e58473a3bb2dda76c70adcbdf048d6df79dadc5a6dd5d1edd17cad00e6442d5a" \
      org.verl-env.matrix-hash="sha256:a94a8f06eb57f61d0cbbe0cc6dc7401ef9c24c98068d8350302c24b7f2a42a3a" \
      org.verl-env.override="false" \
      org.verl-env.pin.hydra-core="1.3.2" \
      org.verl-env.pin.ray="2.60.0" \
      org.verl-env.pin.tensordict="0.10.0" \
      org.verl-env.pin.transformers="5.9.0" \
      org.verl-env.pin.verl="0.9.1" \
      org.verl-env.provided.torch="2.9.1.dev20251204+rocm7.0.2" \
      org.verl-env.provided.vllm="0.20.2rc1" \
      org.verl-env.python="3.12" \
      org.verl-env.rocm="7.0.2" \
      org.verl-env.target="rocm-mi300"
