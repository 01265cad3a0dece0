"""Trust that travels: signed verdict, SBOM and provenance beside and inside every SIF.

``keys`` (key pairs), ``dsse`` (envelopes), ``statements`` (in-toto Statement v1 and the one
statement opener), ``sbom`` (CycloneDX 1.6 of an image), ``sifsig`` (the native Apptainer SIF
signature, over :mod:`builder.sif.format`'s raw reader), ``sign`` (sidecar + embedded objects),
``signatures`` (the offline check), ``remote`` (the registry check), ``referrers`` (pushing
them), ``cluster_signing`` (signed cluster verdicts). The ``build-env trust`` command is
:mod:`builder.commands.trust`.
"""
