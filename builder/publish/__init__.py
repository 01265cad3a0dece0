"""The publish edge: a verified image and its SIF pushed by digest, OCI indexes, attestations and
cluster verdicts attached as referrers, and ``status`` read back from a registry or a SIF."""
