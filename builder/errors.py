"""One error type per stage. Each names where it happened (file:line:key, or target and stage)."""

from __future__ import annotations

import re


class BuildEnvError(Exception):
    """Base class. ``exit_code`` is what the CLI returns (docs/commands.md): 1 a gate or check
    failed, 2 bad input, 3 an infrastructure or network error (:class:`InfraError`)."""

    exit_code = 2
    stage = "build-env"

    def __init__(self, message: str, *, target: str | None = None) -> None:
        self.target = target
        super().__init__(message)

    def __str__(self) -> str:
        where = f"[{self.target}] " if self.target else ""
        return f"{self.stage}: {where}{self.args[0]}"


class UsageError(BuildEnvError):
    """A command line that names nothing usable (an empty argument, an unknown command)."""

    stage = "usage"


class SpecError(BuildEnvError):
    """The matrix file is malformed: names file, line and key."""

    stage = "matrix"

    def __init__(self, message: str, *, file: str, line: int | None = None, key: str | None = None,
                 target: str | None = None) -> None:
        self.file, self.line, self.key = file, line, key
        super().__init__(message, target=target)

    def __str__(self) -> str:
        loc = self.file + (f":{self.line}" if self.line else "")
        key = f" {self.key}:" if self.key else ""
        return f"{loc}:{key} {self.args[0]}"


class CatalogError(SpecError):
    """The upstream catalogue (shipped, or a site's ``catalog.yaml``) is malformed."""

    stage = "catalog"


class CompatError(BuildEnvError):
    """The pins do not fit together (a failed check, not bad syntax)."""

    stage = "check"
    exit_code = 1


class LockError(BuildEnvError):
    stage = "lock"


class RenderError(BuildEnvError):
    stage = "render"


class EngineError(BuildEnvError):
    """The Docker Engine refused or failed (build step, run, tag, push)."""

    stage = "build"
    exit_code = 1


class NoSuchImage(EngineError):
    """The image a command was given is not in the engine (or is no image reference at all):
    bad input, exit 2."""

    stage = "image"
    exit_code = 2


class VerifyError(BuildEnvError):
    stage = "verify"
    exit_code = 1


class SifError(BuildEnvError):
    stage = "sif"
    exit_code = 1


class PublishError(BuildEnvError):
    stage = "publish"
    exit_code = 1


class SlurmError(BuildEnvError):
    stage = "slurm"


class SiteError(BuildEnvError):
    """A matrix's directory lacks what it needs (snapshot, locks); says which command fixes it."""

    stage = "site"


class TrustError(BuildEnvError):
    """Signing or checking attestations failed: names the file, envelope line or key."""

    stage = "trust"
    exit_code = 1


class ClusterError(BuildEnvError):
    """A job directory, or a cluster verdict, that cannot be read or signed: names the path."""

    stage = "cluster"
    exit_code = 1


class InfraError(BuildEnvError):
    """Something outside the user's input failed: an engine, a daemon, a registry, the network.
    Exit 3: retrying may help; changing the input will not."""

    stage = "infrastructure"
    exit_code = 3


class NetworkError(InfraError):
    """A network call (git, index, registry) failed or timed out. The message names the URL with
    its credentials redacted (:func:`redact`) and the way out (``--no-fetch``, ``--index-url``)."""

    stage = "network"

    def __init__(self, url: str, reason: str, *, way_out: str | None = None,
                 target: str | None = None) -> None:
        self.url = redact(url)
        text = f"{self.url}: {reason}" + (f" ({way_out})" if way_out else "")
        super().__init__(text, target=target)


class PublishInfraError(InfraError, PublishError):
    """Publishing stopped for a reason outside the input: the registry down or failing after
    every retry, the engine gone. Still a :class:`PublishError` (stage ``publish``); exit 3."""

    stage = "publish"


def redact(url: str) -> str:
    """``scheme://user:secret@host/...`` -> ``scheme://***@host/...``: no credential in a
    message."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", url)
