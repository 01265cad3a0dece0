"""``build-env publish``: image and SIF to a registry, by digest."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from builder.audit import result as audits
from builder.publish import push as lib
from builder.gate import verdicts
from builder.commands import _shared
from builder.commands import _publish_index as index
from builder.errors import PublishError, UsageError

NAME = "publish"
HELP = "push image and SIF"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", dest="targets", action="append", metavar="TARGET",
                     help="publish the release image of this matrix target; repeat for the "
                          "builds of one stack on several platforms: one OCI image index under "
                          "--tag (needs --sign-key: each platform's verdict travels with it)")
    src.add_argument("--image", metavar="REF", help="publish this image (reference or ID)")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository of the local release tags (default: verl-env)")
    p.add_argument("--force", action="store_true",
                   help="publish an image that has no passing verdict (never into an index)")
    p.add_argument("--sif", type=Path, default=None, metavar="PATH",
                   help="also push this SIF (made from the same image) as an ORAS artifact")
    p.add_argument("--registry", required=True, metavar="HOST[:PORT]/REPO",
                   help="where to push (plain HTTP for loopback hosts)")
    p.add_argument("--tag", default=None, help="registry tag (default: the target name, or the "
                                               "image's tag; required with several targets)")
    p.add_argument("--sif-tag", default=None, help="tag of the SIF artifact (default: TAG-sif)")
    p.add_argument("--record", type=Path, default=None, metavar="PATH",
                   help="publish record (default: build/<target>/publish.json; for several "
                        "targets build/<tag>/publish-index.json)")
    p.add_argument("--insecure", action="store_true", help="plain HTTP to a non-loopback host")
    p.add_argument("--attempts", type=int, default=4,
                   help="tries per registry operation on transient errors (default: 4)")
    _shared.require(p)
    p.add_argument("--sign-key", type=Path, default=os.environ.get("VERL_ENV_SIGN_KEY") or None,
                   metavar="PATH", help="sign the verdict, SBOM and provenance statements (and "
                   "the image's last `build-env audit`, when one is recorded) with this ECDSA key "
                   "and push them as OCI referrers of the image (and the SIF) "
                   "(env VERL_ENV_SIGN_KEY)")
    p.add_argument("--report", type=Path, action="append", default=[], metavar="PATH",
                   help="the build's report.json, for the provenance statement (default: "
                        "build/<target>/report.json); with several targets, repeat in their "
                        "order")
    p.add_argument("--attach", type=Path, action="append", default=[], metavar="FILE",
                   help="a cluster verdict (`build-env cluster`) about --sif: signed with "
                        "--sign-key and pushed as a referrer of the image and the SIF; repeat "
                        "for several")
    p.add_argument("--json", action="store_true", help="print the record as JSON")


def _default_tag(ref: str, target: str | None) -> str:
    if target:
        return target
    last = ref.split("/")[-1]
    return last.split(":", 1)[1] if ":" in last and "@" not in last else "latest"


def run(args: argparse.Namespace) -> int:
    targets = list(dict.fromkeys(args.targets or []))
    if len(targets) > 1:
        return index.run(args, targets)
    args.target = targets[0] if targets else None
    if len(args.report) > 1:
        raise UsageError("--report is given once for one image")
    args.report = args.report[0] if args.report else None
    lib.preflight(args.registry, insecure=args.insecure, attempts=max(1, min(args.attempts, 2)))
    ref, target = _shared.verified_source(args)
    engine, image = _shared.engine_image(ref, target, PublishError)
    require = verdicts.requirement(args.require)
    verdict = verdicts.lookup(image.id)
    problem = verdicts.release_problem(verdict, require)
    if problem and not args.force:
        raise PublishError(f"image {ref} ({image.id[7:19]}) has no passing verdict: {problem}; "
                           "run `build-env verify` first, or pass --force", target=target)
    name = target or re.sub(r"[^A-Za-z0-9_.-]+", "_", ref)
    report = args.report or (Path("build") / target / "report.json" if target else None)
    record = lib.publish(
        engine, image, args.registry, tag=args.tag or _default_tag(ref, target), sif=args.sif,
        target=target, record_path=args.record or Path("build") / name / "publish.json",
        sif_tag=args.sif_tag, insecure=args.insecure, attempts=args.attempts,
        sign_key=args.sign_key, report=report if args.sign_key else None, require=require,
        attach=tuple(args.attach), verdict=verdict)
    if args.json:
        print(json.dumps(record, indent=2, sort_keys=True))
    else:
        print("\n".join(_lines(record)))
    return 0


def _lines(record: dict[str, Any]) -> list[str]:
    """The record, for a person: what went where, signed and attached."""
    lines = [f"image  {record['image']['reference']}"]
    v = record.get("verdict") or {}
    if v:
        gpu = v.get("gpu") or {}
        lines.append(f"verdict {v.get('overall')}, {v.get('level') or v.get('scope')} level, "
                     f"gpu: {gpu.get('status')}" + (f" ({gpu['reason']})" if gpu.get("reason")
                                                     else ""))
    if record["sif"]:
        lines.append(f"sif    {record['sif']['reference']} "
                     f"({record['sif']['size'] / 2**20:.0f} MiB)")
    for what, att in sorted((k, v) for k, v in (record.get("attestations") or {}).items()
                            if isinstance(v, dict)):
        where = att["fallback_index"] or "referrers API"
        lines.append(f"signed {what}: {len(att['referrers'])} referrers of {att['subject'][:19]} "
                     f"({where}; cosign {att['cosign_tag'][:19]}...)")
    audited = [r for att in (record.get("attestations") or {}).values() if isinstance(att, dict)
               for r in att["referrers"] if r.get("kind") == "audit"]
    audit = audits.lookup(str(record.get("image_id") or "")) if audited else None
    if audit is not None:
        lines.append(f"signed audit: {audits.summary(audit)}")
    for c in record.get("clusters") or []:
        lines.append(f"attached cluster verdict {c['cluster']} ({c['overall']}, {c['level']} "
                     f"level, job {c['job']})")
    lines.append(f"record {record['record']}")
    return lines
