"""Load and validate ``matrix.yaml``: the reviewed compatibility matrix.

Every error names the file, the line and the key (``matrix.yaml:14: targets.cuda-x86_64.packages.ray:
...``). The shape (keys, types, enumerations, required keys) is ``matrix.schema.json``'s, checked
first (builder.yamldoc.validate); the grammar of each field (builder.matrix.fields) and the rules
across fields (builder.matrix.rules) follow. The result is a tree of frozen dataclasses
(builder.matrix.model, re-exported here); nothing here touches the network or the Docker Engine.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from builder import yamldoc
from builder.errors import SpecError
from builder.matrix import grammar
from builder.matrix.fields import Ctx
from builder.matrix.model import ARCHES, Base, Matrix, Package, Source, Target
from builder.matrix.rules import SCHEMA_FILE, merge, read_target, schema

__all__ = ["ARCHES", "Base", "Matrix", "Package", "Source", "Target", "TARGET_NAME",
           "apply_overrides", "load_matrix", "modeline", "with_modeline", "SCHEMA_FILE"]

# The comment that points editors (the YAML language server) at the installed schema.
MODELINE = "# yaml-language-server: $schema="


def modeline() -> str:
    """The first line of a site's matrix: editors validate and complete against the schema
    `check` uses (builder/matrix/matrix.schema.json, where this build-env is installed)."""
    return f"{MODELINE}{SCHEMA_FILE.as_uri()}\n"


def with_modeline(text: str) -> str:
    """``text`` with :func:`modeline` as its first line (replacing one already there)."""
    if text.startswith(MODELINE):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    return modeline() + text

# A target name is part of a lock path and of image tags: lower case, digits, '.', '_', '-'.
TARGET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def load_matrix(path: str | Path, text: str | None = None) -> Matrix:
    """Parse and validate a matrix file. Raises :class:`SpecError` naming file:line:key.
    With ``text``: that text read as if it were ``path``'s (an edit checked before it is
    written: relative paths in it resolve beside ``path``)."""
    path = Path(path)
    doc = (yamldoc.read(path, "matrix") if text is None
           else yamldoc.parse(text.encode(), str(path), "matrix"))
    file, raw, lines = doc.file, doc.data, doc.lines
    ctx = Ctx(file, lines)
    yamldoc.validate(doc, schema())  # the shape: matrix.schema.json
    targets_raw: dict[str, Any] = raw["targets"]
    defaults: dict[str, Any] = raw.get("defaults") or {}
    targets: dict[str, Target] = {}
    warnings: list[str] = []
    for name, entry in targets_raw.items():
        key = f"targets.{name}"
        if not TARGET_NAME.fullmatch(str(name)):
            raise ctx.error(key, f"target name {name!r}: use lower-case letters, digits, '.', '_' "
                                 "and '-' (at most 63, starting with a letter or digit): it names "
                                 "a lock file and image tags")
        note = f"inherited by target {name}"
        for k, v in defaults.items():  # defaults report their own lines when they are the culprit
            if k not in entry:
                ctx.written[f"{key}.{k}"] = (f"defaults.{k}", note)
                for dk, dl in list(lines.items()):
                    if dk == f"defaults.{k}" or dk.startswith((f"defaults.{k}.",
                                                               f"defaults.{k}[")):
                        lines.setdefault(key + dk[len("defaults"):], dl)
        merged = merge(defaults, entry)
        for k in ("base", "packages", "provided"):
            if isinstance(defaults.get(k), dict) and isinstance(entry.get(k), dict):
                for sub in defaults[k]:
                    if sub not in entry[k]:
                        ctx.written[f"{key}.{k}.{sub}"] = (f"defaults.{k}.{sub}", note)
                        lines.setdefault(f"{key}.{k}.{sub}", lines.get(f"defaults.{k}.{sub}", 0))
        t = read_target(ctx, str(name), merged, key)
        if not t.base.pinned_digest:
            warnings.append(f"{t.where('base.image')}: targets.{name}.base: base image "
                            f"{t.base.image!r} is pinned by tag only; add its digest")
        targets[str(name)] = t
    return Matrix(path, targets, tuple(warnings))


# --------------------------------------------------------------------------- overrides


def apply_overrides(target: Target, assignments: list[str], *, base_image: str | None = None
                    ) -> Target:
    """Apply ``--set KEY=VALUE`` / ``--base-image`` for local experiments.

    Keys: ``python``, ``cuda``, ``rocm``, ``packages.NAME`` (version), ``packages.NAME.enabled``,
    ``packages.NAME.build``, ``provided.NAME``. The result is marked ``override=True`` and is
    re-validated by the same rules as the matrix.
    """
    if not assignments and not base_image:
        return target
    raw = target.to_dict()
    for item in assignments:
        if "=" not in item:
            raise SpecError(f"--set expects KEY=VALUE, got {item!r}", file="--set", key=item)
        key, value = item.split("=", 1)
        parts = key.split(".")
        if parts[0] in ("python", "cuda", "rocm") and len(parts) == 1:
            raw[parts[0]] = value
        elif parts[0] == "packages" and len(parts) in (2, 3):
            name = canonicalize_name(parts[1])
            entry = raw["packages"].setdefault(name, {"version": value})
            if len(parts) == 2:
                entry["version"] = value
            elif parts[2] == "enabled":
                flag = {"1": True, "true": True, "yes": True, "on": True,
                        "0": False, "false": False, "no": False, "off": False}.get(value.lower())
                if flag is None:
                    raise SpecError(f"expected true or false, got {value!r}", file="--set",
                                    key=key)
                entry["enabled"] = flag
            elif parts[2] in ("build", "source"):
                entry[parts[2]] = value
            else:
                raise SpecError(f"cannot override {key!r}", file="--set", key=key)
        elif parts[0] == "gpus" and len(parts) == 1:
            raw["gpus"] = [g.strip() for g in value.split(",") if g.strip()]
        elif parts[0] == "provided" and len(parts) == 2:
            raw["provided"][canonicalize_name(parts[1])] = value
        else:
            raise SpecError(f"cannot override {key!r} (python, cuda, rocm, gpus, packages.NAME"
                            "[.enabled|.build], provided.NAME)", file="--set", key=key)
    if base_image:
        try:
            grammar.oci_reference(base_image)
        except grammar.GrammarError as exc:
            raise SpecError(str(exc), file="--base-image") from None
        raw["base"] = {"image": base_image}
    name = raw.pop("name")
    lines = {"": 0}
    ctx = Ctx("--set", lines)
    body = {k: v for k, v in raw.items() if v not in (None, [], {}) or k in ("packages",)}
    t = read_target(ctx, name, body, f"targets.{name}")
    # a package's `import:` is not in the canonical entry (to_dict): carry it over, so the gate
    # of an override build imports what the matrix names (sglang-kernel: sgl_kernel)
    named = {p.name: p.import_name for p in target.packages if p.import_name}
    packages = tuple(replace(p, import_name=named.get(p.name, p.import_name)) for p in t.packages)
    return replace(t, packages=packages, override=True, file=target.file, lines=target.lines)
