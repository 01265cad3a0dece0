"""The fixtures the multiarch tests share with other groups: QEMU emulation and the arm64
debootstrap base (``tests/pipeline/test_arm64.py``), the real registries (``tests/publish``)."""

from tests.pipeline.test_arm64 import arm64_base, emulation
from tests.publish.conftest import auth_registry, registry_factory

__all__ = ["arm64_base", "auth_registry", "emulation", "registry_factory"]
