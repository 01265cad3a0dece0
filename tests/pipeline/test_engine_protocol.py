"""The engine as an interface: the Docker :class:`~builder.engine.Engine` and every fake engine
of the test suite are checked against the protocol they declare
(:class:`~builder.engine.ContainerEngine`, or :class:`~builder.engine.EngineHealth` for what
:mod:`builder.engine.faults` asks).

The check runs here, without a type checker: each fake subclasses its protocol, and every public
member it defines is a member of that protocol with the same signature (parameter names, kinds,
defaults, resolved annotations and return type). A fake stands in for the few calls its test
drives, so it need not define them all; the Docker engine defines every one. A protocol change
that a fake does not follow fails here, not as a test that passes against an engine that no
longer exists.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from builder.engine import ContainerEngine, Engine, EngineHealth
from tests.core.test_cross_arch import _Engine as ArchEngine
from tests.core.test_vendor import _FakeEngine as VendorEngine
from tests.pipeline.test_faults import FaultsEngine
from tests.pipeline.test_seams import CountingEngine, PlanEngine

FAKES: list[tuple[type, type]] = [(CountingEngine, ContainerEngine), (PlanEngine, ContainerEngine),
                                  (VendorEngine, ContainerEngine),
                                  (ArchEngine, ContainerEngine), (FaultsEngine, EngineHealth)]


def _protocol_members(protocol: type) -> set[str]:
    """The public members a protocol declares, its protocol bases' included."""
    return {name for cls in protocol.__mro__ if getattr(cls, "_is_protocol", False)
            and cls is not typing.Protocol and cls is not typing.Generic
            for name in vars(cls) if not name.startswith("_")}


def _signature(cls: type, name: str) -> tuple[str, list[tuple[Any, ...]], Any]:
    """A member as compared: property or method, its parameters, its return type."""
    attr = inspect.getattr_static(cls, name)
    kind = "property" if isinstance(attr, property) else type(attr).__name__
    fn = attr.fget if isinstance(attr, property) else attr
    assert callable(fn), f"{cls.__name__}.{name} is neither a method nor a property"
    hints = typing.get_type_hints(fn)
    params = [(p.name, p.kind, p.default, hints.get(p.name))
              for p in inspect.signature(fn).parameters.values()]
    return kind, params, hints.get("return")


def _defined_by(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in vars(c))


def test_the_docker_engine_implements_every_member_of_the_protocol() -> None:
    assert ContainerEngine in Engine.__mro__
    for name in sorted(_protocol_members(ContainerEngine)):
        assert not getattr(_defined_by(Engine, name), "_is_protocol", False), (
            f"Engine does not implement {name}")
        assert _signature(Engine, name) == _signature(ContainerEngine, name), name


@pytest.mark.parametrize("fake, protocol", FAKES, ids=lambda c: c.__name__)
def test_every_fake_engine_declares_its_protocol_and_keeps_its_signatures(
        fake: type, protocol: type) -> None:
    assert protocol in fake.__mro__, f"{fake.__name__} does not declare {protocol.__name__}"
    members = _protocol_members(protocol)
    own = {name for name, value in vars(fake).items() if not name.startswith("_")
           and (callable(value) or isinstance(value, property))}
    assert own, f"{fake.__name__} fakes nothing"
    assert own <= members, f"{fake.__name__} fakes what the protocol lacks: {own - members}"
    for name in sorted(own):
        assert _signature(fake, name) == _signature(protocol, name), f"{fake.__name__}.{name}"


def test_the_check_sees_a_fake_that_drifted() -> None:
    class Drifted(ContainerEngine):
        def tag(self, image_id: str, name: str) -> None:  # the protocol's is `ref`
            pass

    assert _signature(Drifted, "tag") != _signature(ContainerEngine, "tag")
    assert _signature(CountingEngine, "run") == _signature(Engine, "run")
