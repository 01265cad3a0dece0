"""The baked manifest (``/opt/verl-env/manifest.json``), pin matching, and what the target
expects of GPUs. Pure apart from ``load_manifest`` reading one file."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from . import MANIFEST_SCHEMA
from .report import CPU_TARGET, NO_GPU_BUILD_HOST

ACCELERATORS = ("cuda", "rocm", "cpu")


class ManifestError(Exception):
    """The manifest is missing or malformed (the self-test cannot know what to check)."""


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_map(raw: Any, key: str, path: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ManifestError(f"{path}: '{key}' must map names to strings")
    return {normalize(k): v for k, v in raw.items()}


def parse_manifest(data: Any, path: str = "manifest.json") -> dict[str, Any]:
    """Validate and normalise a manifest dict; raises ManifestError naming the key."""
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: not a JSON object")
    schema = data.get("schema", MANIFEST_SCHEMA)
    if schema != MANIFEST_SCHEMA:
        raise ManifestError(f"{path}: schema {schema!r}, expected {MANIFEST_SCHEMA!r}")
    acc = data.get("accelerator")
    if acc not in ACCELERATORS:
        raise ManifestError(f"{path}: 'accelerator' must be one of {ACCELERATORS}, got {acc!r}")
    out = dict(data)
    out["schema"] = schema
    out["pins"] = _name_map(data.get("pins"), "pins", path)
    out["provided"] = _name_map(data.get("provided"), "provided", path)
    out["imports"] = _name_map(data.get("imports"), "imports", path)
    out.setdefault("target", None)
    out.setdefault("cuda", None)
    out.setdefault("rocm", None)
    out["gpus"] = parse_gpus(data.get("gpus"), acc, path)
    for key, what in (("coverage_allow", "library globs"), ("abi_allow", "shared-object globs"),
                      ("record_shared", "path globs")):
        out[key] = _allowances(data.get(key), key, what, path)
    if "checks" in data:  # absent: an image built before they travelled with it
        out["checks"] = _checks(data["checks"], path)
    return out


def _checks(raw: Any, path: str) -> dict[str, dict[str, dict[str, str]]]:
    """The catalogue's checks (``{DIST: {NAME: {"code": ..., "pass": ...}}}``)."""
    checks = raw
    if not (isinstance(checks, dict) and all(
            isinstance(d, str) and isinstance(c, dict) and all(
                isinstance(n, str) and isinstance(e, dict)
                and all(isinstance(e.get(k), str) for k in ("code", "pass"))
                for n, e in c.items()) for d, c in checks.items())):
        raise ManifestError(f"{path}: 'checks' must map distributions to named checks, each "
                            "with 'code' and 'pass' strings")
    return checks


def _allowances(raw: Any, key: str, what: str, path: str) -> dict[str, str]:
    """A reviewed allowance map (``{GLOB: REASON}``, matched by :mod:`.phases.allowpath`)."""
    allow = raw or {}
    if not isinstance(allow, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in allow.items()):
        raise ManifestError(f"{path}: '{key}' must map {what} to reasons")
    return dict(allow)


_GPU_ID = {"cuda": (re.compile(r"^sm_\d{2,3}[af]?$"), "sm_XY (e.g. sm_90, sm_100)"),
           "rocm": (re.compile(r"^gfx[0-9a-f]{3,4}(?::(?:xnack|sramecc)[+-])*$"),
                    "gfxNNN[:xnack±][:sramecc±] (e.g. gfx942)")}


def parse_gpus(raw: Any, accelerator: str, path: str) -> list[str] | None:
    """The GPUs the target must run on (``"gpus": ["sm_80", "sm_90"]`` or ``["gfx942"]``).

    None when absent (an older manifest: the coverage phase then cannot decide). A cpu target
    declares none."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(g, str) for g in raw):
        raise ManifestError(f"{path}: 'gpus' must be a list of strings")
    if accelerator not in _GPU_ID:
        if raw:
            raise ManifestError(f"{path}: 'gpus' {raw} given for a {accelerator} target")
        return []
    pattern, form = _GPU_ID[accelerator]
    for i, gpu in enumerate(raw):
        if not pattern.match(gpu):
            raise ManifestError(f"{path}: gpus[{i}] {gpu!r} is not a {accelerator} GPU id; "
                                f"expected {form}")
    if len(set(raw)) != len(raw):
        raise ManifestError(f"{path}: 'gpus' lists a GPU twice: {raw}")
    return list(raw)


# The catalogue's copies the build ships beside this package (builder.shipped writes them): the
# ABI phase's loader rules and the cpu phase's checks, for a manifest that carries neither.
PAYLOAD_LOADER_RULES = "loader_rules.json"
PAYLOAD_CHECKS = "catalog_checks.json"


def payload_file(name: str) -> str:
    """A file the build ships beside this package in the self-test payload (the catalogue's
    copies: ``builder.shipped``); absent when the self-test runs from a source tree."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def read_payload(path: str) -> Any:
    """The JSON of a payload file; None when it is absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_manifest(path: str) -> dict[str, Any]:
    """Read and validate the manifest file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest not found (pass --manifest)") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"{path}: cannot read manifest: {e}") from None
    return parse_manifest(data, path)


def declared(manifest: Mapping[str, Any], name: str) -> bool:
    """Whether the target pins, provides or imports the distribution ``name``."""
    n = normalize(name)
    return any(n in manifest.get(k, {}) for k in ("pins", "provided", "imports"))


def split_local(version: str) -> tuple[str, str | None]:
    """``"2.6.0+cu124"`` → ``("2.6.0", "cu124")``."""
    public, sep, local = version.partition("+")
    return public, (local if sep else None)


def pin_matches(pin: str, installed: str,
                parse: Callable[[str], Any] | None = None) -> bool:
    """A pin matches when equal, or when the pin has no local segment and the installed
    public version equals it. ``parse`` (``packaging.version.Version`` when the image has it)
    makes ``2.6`` equal ``2.6.0``; without it the comparison is textual."""
    pin_pub, pin_local = split_local(pin.strip())
    inst_pub, inst_local = split_local(installed.strip())
    if pin_local is not None and pin_local != inst_local:
        return False
    if parse is not None:
        try:
            return bool(parse(pin_pub) == parse(inst_pub))
        except Exception:  # noqa: BLE001 - unparsable: fall back to text
            pass
    return pin_pub == inst_pub


@dataclass(frozen=True)
class GpuExpectation:
    """What the run expects of GPUs.

    ``expected``: GPU and NCCL/RCCL checks are required. ``count``: how many GPUs must be
    visible (None: whatever is visible). ``applies``: the target has an accelerator, so a skip
    counts under ``--strict``. ``skip_reason``: why GPU checks are skipped when not expected.
    """

    expected: bool
    count: int | None
    applies: bool
    skip_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (travels to the phase subprocesses)."""
        return asdict(self)


def parse_expect(text: str) -> int | None:
    """``auto`` → None, ``N`` → N (≥ 0); ValueError otherwise."""
    if text.strip().lower() == "auto":
        return None
    n = int(text)
    if n < 0:
        raise ValueError("must be auto or a count >= 0")
    return n


def needs_detection(expect: int | None, accelerator: str) -> bool:
    """Only ``auto`` on a GPU target needs to look at the visible GPUs to decide."""
    return expect is None and accelerator in ("cuda", "rocm")


def resolve_expectation(expect: int | None, accelerator: str,
                        visible: int | None) -> GpuExpectation:
    """Decide whether GPU checks are required.

    ``--expect-gpus N>0``: required, N must be visible. ``--expect-gpus 0``: skipped (reason
    says so) but they still apply to a GPU target. ``auto``: required when the target is
    cuda/rocm and GPUs are visible; with none visible they are skipped with
    "no GPU visible (build host)", not required. If detection itself failed (``visible`` None)
    they stay required, so nothing can pass by default.
    """
    gpu_target = accelerator in ("cuda", "rocm")
    if expect is not None and expect > 0:
        return GpuExpectation(True, expect, True, None)
    if expect == 0:
        reason = "--expect-gpus 0" if gpu_target else CPU_TARGET
        return GpuExpectation(False, 0, gpu_target, reason)
    if not gpu_target:
        return GpuExpectation(False, 0, False, CPU_TARGET)
    if visible is None:
        return GpuExpectation(True, None, True, None)
    if visible == 0:
        return GpuExpectation(False, 0, True, NO_GPU_BUILD_HOST)
    return GpuExpectation(True, visible, True, None)


def expectation_from_dict(d: Mapping[str, Any]) -> GpuExpectation:
    """Inverse of ``GpuExpectation.to_dict``."""
    return GpuExpectation(bool(d["expected"]), d.get("count"), bool(d["applies"]),
                          d.get("skip_reason"))


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"1G"``, ``"256MiB"``, ``"4096"`` → bytes (K/M/G/T are powers of 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    mult = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    size = int(float(m.group(1)) * mult)
    if size <= 0:
        raise ValueError(f"size must be > 0: {text!r}")
    return size


def truthy(value: str | None) -> bool:
    """Environment-variable truthiness: unset, empty, 0, false, no, off are false."""
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")
