"""The fixtures the multiarch tests share with other groups: the real registries
(``tests/publish``). QEMU emulation, the arm64 base and the arm64 build are session fixtures
(tests/support/arm64.py), shared with ``tests/pipeline/test_arm64.py``."""

from tests.publish.conftest import auth_registry, registry_factory

__all__ = ["auth_registry", "registry_factory"]
