"""Pure logic: what the verdict statement carries, what the provenance records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from builder.errors import TrustError
from builder.trust import statements as st
from builder.gate.verdicts import Verdict
from tests.trust.conftest import CUDA_BUILD_VERDICT


def test_the_verdict_statement_is_the_one_serialisation() -> None:
    """The predicate carries the record as Verdict.to_dict writes it, with its level; reading
    it back gives the same verdict (the release rule itself: tests/gate/test_verdicts.py)."""
    v = Verdict.from_dict(CUDA_BUILD_VERDICT)
    pred = st.verdict_predicate(v)
    assert pred["verdict"] == CUDA_BUILD_VERDICT and pred["level"] == "build"
    assert pred["gpu"] == "pending" and pred["selftestVersion"] == "0.3.0"
    assert st.read_verdict(pred, "here").to_dict() == CUDA_BUILD_VERDICT
    with pytest.raises(TrustError, match="here: the verdict is not a JSON object"):
        st.read_verdict({"verdict": "pass"}, "here")
    assert not hasattr(st, "release_problem")  # one release rule: builder.gate.verdicts


def test_provenance_from_a_report(report: Path) -> None:
    p = st.ProvenanceInputs.from_report(report)
    pred = st.provenance_predicate(p)
    deps = {d["name"]: d["digest"] for d in pred["buildDefinition"]["resolvedDependencies"]}
    dockerfile = Path(json.loads(report.read_text())["stages"]["render"]["context"]) / "Dockerfile"
    assert deps["Dockerfile"] == {"sha256": hashlib.sha256(dockerfile.read_bytes()).hexdigest()}
    assert deps["lock"] == {"sha256": "2" * 64} and deps["base-image"] == {"sha256": "4" * 64}
    assert pred["buildDefinition"]["externalParameters"]["pins"]["verl"] == "0.5.0"
    assert pred["runDetails"]["builder"]["id"] == st.BUILDER_ID
    assert pred["buildDefinition"]["internalParameters"]["buildHostArch"]
    assert pred["runDetails"]["metadata"]["invocationId"] == "sha256:" + "3" * 64


def test_a_report_without_its_dockerfile_is_named(report: Path) -> None:
    data = json.loads(report.read_text())
    Path(data["stages"]["render"]["context"], "Dockerfile").unlink()
    with pytest.raises(TrustError, match=rf"{report}: stages.render.context has no Dockerfile"):
        st.ProvenanceInputs.from_report(report)
