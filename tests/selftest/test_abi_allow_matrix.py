"""``abi_allow`` as reviewed matrix data, mirroring ``coverage_allow``: validated with a
file:line:key error (and exit 2 at the CLI), carried into the image's manifest, read by the
self-test's manifest loader; and the shipped entries name real objects with a reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.errors import SpecError
from builder.render.baked import manifest
from builder.selftest.manifest import ManifestError, load_manifest
from builder.matrix.spec import load_matrix

REPO = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((REPO / "matrix.yaml").read_text())
WHY = "needs the system libheif.so.1, which the image does not ship"


def matrix_with(tmp_path: Path, value: object) -> Path:
    raw = json.loads(json.dumps(RAW))
    raw["targets"]["cuda-x86_64"]["abi_allow"] = value
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("value,key,says", [
    ({"**": WHY}, "targets.cuda-x86_64.abi_allow.**", "a glob must name shared objects"),
    ({"torchcodec/libtorchcodec_heic.so": "optional"},
     "targets.cuda-x86_64.abi_allow.torchcodec/libtorchcodec_heic.so", "give the reason"),
    ({"torchcodec/x.so": "line one\nline two is here"},
     "targets.cuda-x86_64.abi_allow.torchcodec/x.so", None),
    (["torchcodec/x.so"], "targets.cuda-x86_64.abi_allow", "expected a mapping"),
    ({}, "targets.cuda-x86_64.abi_allow", "expected a mapping"),
])
def test_a_bad_allowance_names_file_line_and_key(tmp_path: Path, value: object, key: str,
                                                 says: str) -> None:
    path = matrix_with(tmp_path, value)
    with pytest.raises(SpecError, match=says) as caught:
        load_matrix(path)
    err = caught.value
    assert err.key == key and err.line and str(err).startswith(f"{path}:{err.line}: {key}:")


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = matrix_with(tmp_path, {"x/y.so": "short"})
    proc = subprocess.run([sys.executable, "-m", "builder", "check", "--matrix", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "abi_allow.x/y.so" in lines[0] and "Traceback" not in proc.stderr


def test_the_allowance_reaches_the_manifest_and_the_selftest(tmp_path: Path) -> None:
    t = load_matrix(matrix_with(tmp_path, {"torchcodec/libtorchcodec_heic.so": WHY})) \
        .targets["cuda-x86_64"]
    assert t.abi_allow == (("torchcodec/libtorchcodec_heic.so", WHY),)
    assert t.to_dict()["abi_allow"] == {"torchcodec/libtorchcodec_heic.so": WHY}
    m = manifest(t, "m" * 64, "l" * 64)
    assert m["abi_allow"] == {"torchcodec/libtorchcodec_heic.so": WHY}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    assert load_manifest(str(path))["abi_allow"] == m["abi_allow"]
    path.write_text(json.dumps({**m, "abi_allow": ["torchcodec/libtorchcodec_heic.so"]}))
    with pytest.raises(ManifestError, match="'abi_allow' must map shared-object globs"):
        load_manifest(str(path))


def test_the_shipped_allowances_are_reviewed_entries() -> None:
    """Each shipped entry names objects under a package directory and says in words which
    library the image lacks and what is lost."""
    t = load_matrix(REPO / "matrix.yaml").targets["cuda-x86_64"]
    globs = dict(t.abi_allow)
    assert set(globs) >= {"torchcodec/libtorchcodec_core*.so", "torchcodec/libtorchcodec_heic.so",
                          "nvidia/nvshmem/lib/nvshmem_transport_ucx.so.*"}
    for glob, why in globs.items():
        assert "/" in glob and len(why.split()) >= 15, (glob, why)
        assert re.search(r"lib[a-z0-9_]+|FFmpeg", why), (glob, why)
