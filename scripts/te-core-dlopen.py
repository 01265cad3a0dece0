"""dlopen libtransformer_engine.so with RTLD_NOW, after what TE's loader opens first."""
import ctypes, glob, os, sys, sysconfig
import torch  # noqa: F401  (NCCL into the process, as every user of TE does first)
site = sysconfig.get_path("purelib")
nv = os.path.join(site, "nvidia")
for pat in ("cudnn/lib/lib*.so.*[0-9]", "cu13/lib/libnvrtc*.so.*[0-9]", "cu13/lib/libcurand*.so.*[0-9]",
            "cu13/lib/libcublas*.so.*[0-9]", "cu13/lib/libcudart*.so.*[0-9]"):
    for p in glob.glob(os.path.join(nv, pat)):
        ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
core = os.path.join(site, "transformer_engine/wheel_lib/libtransformer_engine.so")
try:
    ctypes.CDLL(core, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    print("RTLD_NOW dlopen of libtransformer_engine.so: OK")
except OSError as e:
    print("RTLD_NOW dlopen of libtransformer_engine.so: FAILED:", e); sys.exit(1)
