"""Pure logic: what counts as a release verdict, what the provenance records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from builder.errors import TrustError
from builder.trust import statements as st
from tests.trust.conftest import RELEASE_VERDICT


@pytest.mark.parametrize("change, reason", [
    ({"overall": "fail"}, "overall is 'fail'"),
    ({"overall": "incomplete"}, "overall is 'incomplete'"),
    ({"partial": True}, "partial"),
    ({"release": False}, "release: false"),
    ({"report": {**RELEASE_VERDICT["report"], "overall": "incomplete"}}, "self-test report says"),
    ({"report": {**RELEASE_VERDICT["report"], "partial": True}}, "self-test report is partial"),
])
def test_only_a_full_passing_run_is_a_release_verdict(change: dict, reason: str) -> None:
    assert st.release_problem(RELEASE_VERDICT) is None
    problem = st.release_problem({**RELEASE_VERDICT, **change})
    assert problem is not None and reason in problem


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
