"""dlopen libtransformer_engine.so with RTLD_NOW, after the CUDA libraries TransformerEngine's
loader opens first (transformer_engine/common/__init__.py); run inside the image's venv."""
import ctypes
import glob
import os
import sys
import sysconfig

import torch

assert torch  # NCCL into the process, as every user of TE does first
site = sysconfig.get_path("purelib")
nv = os.path.join(site, "nvidia")
for pat in ("cudnn/lib/lib*.so.*[0-9]", "cu13/lib/libnvrtc*.so.*[0-9]",
            "cu13/lib/libcurand*.so.*[0-9]", "cu13/lib/libcublas*.so.*[0-9]",
            "cu13/lib/libcudart*.so.*[0-9]"):
    for p in glob.glob(os.path.join(nv, pat)):
        ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
core = os.path.join(site, "transformer_engine/wheel_lib/libtransformer_engine.so")
try:
    ctypes.CDLL(core, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    print("RTLD_NOW dlopen of libtransformer_engine.so: OK")
except OSError as e:
    print("RTLD_NOW dlopen of libtransformer_engine.so: FAILED:", e)
    sys.exit(1)
