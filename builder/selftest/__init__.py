"""verl-env in-image self-test.

Shipped inside every image as ``/opt/verl-env/verl_env_selftest/`` and run as
``python -m verl_env_selftest``. Only the Python standard library is imported at module
import time; the image's own packages (torch, ray, tensordict, packaging, vllm, verl, ...)
are imported lazily inside the checks, each phase in its own subprocess.

See ``docs/selftest.md`` for the CLI, the checks and the report schema.
"""

SCHEMA = "verl-env/selftest/v1"
MANIFEST_SCHEMA = "verl-env/manifest/v1"
BW_REF_SCHEMA = "verl-env/bw-ref/v1"
DEFAULT_MANIFEST = "/opt/verl-env/manifest.json"
__version__ = "1.0.0"
