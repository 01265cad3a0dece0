"""What several commands share: the option groups, opening the site or the verified image a
command acts on, JSON output, progress. Nothing below the commands sees an argparse Namespace."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder import shipped
from builder import argtypes
from builder.argtypes import non_negative_int, positive_float, positive_int
from builder.errors import BuildEnvError, EngineError, InfraError, NoSuchImage, SiteError
from builder.matrix.spec import load_matrix
from builder.resolve.targets import Site, open_site

if TYPE_CHECKING:
    from builder.engine import Engine, ImageInfo

SCHEMA = "verl-env/{}/v1"  # every --json document names its kind and version
NO_SITE = "no site here: run build-env init"


class _Matrix(argparse.Action):
    """``--matrix PATH``: also records that the user named the site (``args.matrix_given``);
    without it the CLI falls back to ``./matrix.yaml`` or the shipped reference."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        namespace.matrix = values
        namespace.matrix_given = True


def common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", type=argtypes.file_path, default=None, action=_Matrix,
                   help="the compatibility matrix (default: ./matrix.yaml if present, else the "
                        "reference matrix shipped with build-env)")
    p.add_argument("--snapshot", type=argtypes.file_path, default=None,
                   help="package metadata snapshot (default: metadata/pypi-snapshot.json beside "
                        "the matrix)")


def quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only errors (and --json output)")


def json_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON (with a schema)")


def index_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index-url", type=argtypes.index_url, default=None, metavar="URL",
                   help="the site's own package index (PEP 503/691 simple API) for metadata, "
                        "locks and image builds (config: index_url; env VERL_ENV_INDEX_URL); "
                        "never written into a lock, a layer, a label or a log")


def overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   type=argtypes.assignment,
                   help="override a pin for a local experiment (python=3.11, packages.verl=0.9.0, "
                        "packages.NAME.enabled=false); the result is labelled an override")
    p.add_argument("--base-image", type=argtypes.image_reference, default=None, metavar="REF",
                   help="build FROM this image instead of the matrix's base (an override)")


def render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ca-bundle", type=argtypes.file_path,
                   default=os.environ.get("VERL_ENV_CA_BUNDLE") or None, metavar="PATH",
                   help="site CA bundle injected into the build (env VERL_ENV_CA_BUNDLE); "
                        "needed behind a TLS-intercepting proxy")
    p.add_argument("--templates", type=argtypes.file_path, default=None, metavar="DIR",
                   help="a site's Dockerfile templates (Dockerfile.j2, _macros.j2), searched "
                        "before the shipped ones")


def gate_options(p: argparse.ArgumentParser) -> None:
    """How a build's steps and its gate run (build and propose --build)."""
    p.add_argument("--network", default="host",
                   help="network for build steps (default: host; 'default' for the daemon's)")
    p.add_argument("--verify-timeout", type=positive_float, default=900, metavar="SECONDS")
    p.add_argument("--gpus", choices=["auto", "nvidia", "amd", "none"], default="auto",
                   help="GPUs handed to the verification container (auto: what the host has)")
    p.add_argument("--expect-gpus", type=non_negative_int, default=None, metavar="N",
                   help="GPUs the gate must see (default: what the engine's host shows for the "
                        "target's family; 0 for an emulated build)")


def build_options(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", dest="targets", action="append",
                       help="matrix target to build (repeat for several, built concurrently)")
    which.add_argument("--all", action="store_true", help="build every target of the matrix")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="targets built at once (default: all of them)")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository for release tags (default: verl-env; config: tag_prefix)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the context and report.json go (default: build/<target>; "
                        "DIR/<target> for several targets)")
    p.add_argument("--keep-candidate", action="store_true",
                   help="keep a failed image, tagged <prefix>:<target>-candidate")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the build output")
    gate_options(p)
    p.add_argument("--reverify", action="store_true",
                   help="run the gate again even when the content tag holds a release verdict")
    require(p)
    p.add_argument("--sif", type=Path, default=None, metavar="PATH",
                   help="also convert the verified image to this .sif (a directory for several "
                        "targets: DIR/<target>.sif)")
    p.add_argument("--sign-key", type=Path, default=os.environ.get("VERL_ENV_SIGN_KEY") or None,
                   metavar="PATH", help="sign the SIF's attestations (verdict, SBOM, provenance) "
                   "with this ECDSA key (env VERL_ENV_SIGN_KEY; config: sign_key; "
                   "`build-env trust keygen`)")
    p.add_argument("--sign-pgp-key", type=Path,
                   default=os.environ.get("VERL_ENV_SIGN_PGP_KEY") or None, metavar="PATH",
                   help="also sign the SIF itself (apptainer verify) with this OpenPGP key "
                        "(env VERL_ENV_SIGN_PGP_KEY)")
    p.add_argument("--push", default=None, metavar="REGISTRY/REPO",
                   help="also publish the verified image (and the SIF) to this registry "
                        "(config: registry)")


def site(args: argparse.Namespace) -> Site:
    """The site a command reads: the one named, or the shipped reference (read-only)."""
    return open_site(args.matrix, args.snapshot)


def writable_site(args: argparse.Namespace, what: str) -> Site:
    """The site a command writes into (``what``: its matrix, snapshot or locks): ``./matrix.yaml``
    or ``--matrix``, never the reference shipped inside the installed package. Elsewhere one
    line, exit 2, before anything is read, fetched or written."""
    given = getattr(args, "matrix_given", False) or Path("matrix.yaml").is_file()
    matrix = Path(args.matrix) if args.matrix is not None else None
    inside = matrix is not None and matrix.resolve().is_relative_to(shipped.PACKAGE)
    if not given or inside:
        where = (f"{matrix} is the reference shipped inside the installed build-env"
                 if given else f"{Path.cwd()} has no matrix.yaml and no --matrix was given")
        raise SiteError(f"{NO_SITE} DIR (then cd DIR), or pass --matrix: {what} writes into "
                        f"a site and {where}")
    return open_site(matrix, args.snapshot)


def target_names(args: argparse.Namespace) -> list[str] | None:
    """The ``--target`` names, each once, in order; None: every target."""
    return list(dict.fromkeys(args.targets)) if args.targets else None


def emit_json(kind: str, payload: dict[str, Any]) -> None:
    """One JSON document on stdout: ``{"schema": "verl-env/<kind>/v1", ...}``."""
    print(json.dumps({"schema": SCHEMA.format(kind), **payload}, indent=2, sort_keys=True))


def info(args: argparse.Namespace, line: str) -> None:
    """A human line on stdout, unless --quiet or --json asked for none."""
    if not (getattr(args, "quiet", False) or getattr(args, "json", False)):
        print(line, flush=True)


@contextmanager
def progress(args: argparse.Namespace, what: str) -> Iterator[None]:
    """A progress line on stderr for a step that may take more than a second: a plain line when
    it starts and one when it ends (CI logs), rewritten in place on a terminal."""
    if getattr(args, "quiet", False):
        yield
        return
    tty = sys.stderr.isatty()
    print(f"{what} ...", end="" if tty else "\n", file=sys.stderr, flush=True)
    start = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        took = f"{time.monotonic() - start:.1f} s"
        end = f"done in {took}" if ok else f"stopped after {took}"
        print(f"\r{what}: {end}" if tty else f"{what}: {end}", file=sys.stderr, flush=True)


def require(p: argparse.ArgumentParser, to: str | None = None) -> None:
    """``--require build|gpu``: the verdict level that unlocks tags, SIF and publish; ``to``:
    what ``trust sign``/``trust verify`` do at that level (sign, accept)."""
    from builder.gate import verdicts  # here: the commands without --require never read it
    if to is None:
        text = ("the verdict level the image needs: build (default; a GPU family's GPU phases "
                f"may be pending) or gpu (they passed on GPUs); env {verdicts.REQUIRE_ENV}; "
                "config: require")
    else:
        text = (f"the verdict level to {to}: build (default; the GPU phases may be pending) or "
                "gpu (GPU and collective phases proven on GPUs); env "
                f"{verdicts.REQUIRE_ENV}")
    p.add_argument("--require", choices=verdicts.LEVELS, default=None, help=text)


def verified_image(p: argparse.ArgumentParser, verb: str) -> None:
    """The image a command takes from the gate: a target's release image or a reference, the
    repository of the release tags, and ``--force`` for one without a passing verdict."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help=f"{verb} the release image of this matrix target")
    src.add_argument("--image", metavar="REF", help=f"{verb} this image (reference or ID)")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository of the local release tags (default: verl-env)")
    p.add_argument("--force", action="store_true",
                   help=f"{verb} an image that has no passing verdict")


def verified_source(args: argparse.Namespace) -> tuple[str, str | None]:
    """The image of the :func:`verified_image` options: (reference, target). An unknown target
    is a usage error, raised before the engine is asked."""
    if args.target:
        load_matrix(args.matrix).target(args.target)
        return f"{args.tag_prefix}:{args.target}", args.target
    return args.image, None


def output_name(ref: str, target: str | None) -> str:
    """The default file name (without suffix) of what a command writes from an image."""
    return target or ref.split("/")[-1].replace(":", "_").replace("@", "_")


def engine_image(ref: str, target: str | None, error: type[BuildEnvError]
                 ) -> tuple[Engine, ImageInfo]:
    """The engine and the image ``ref`` names in it; a missing image is ``error``."""
    # the docker SDK, imported by the commands that connect, not by every command at start-up
    from builder.engine import Engine
    engine = Engine.connect()
    try:
        return engine, engine.image(ref)
    except (NoSuchImage, InfraError):
        raise  # bad input (exit 2) or a dead engine (exit 3), not the caller's failed check
    except EngineError as exc:
        raise error(str(exc).split(": ", 1)[-1], target=target) from None
