"""``build-env propose``: the newest coherent pins for a target, why each stops, a candidate.

- :mod:`~builder.propose.coherence`: can one release be installed on the target at all (python,
  platform wheels, CUDA / ROCm / CPU build)
- :mod:`~builder.propose.search`: the search over the snapshot's requirement data
- :mod:`~builder.propose.reasons`: why a package stops, in words naming both packages
- :mod:`~builder.propose.proposal`: the proposal (pins old -> new, reasons, lock, gate)
- :mod:`~builder.propose.online`: the snapshot refreshed for the candidate releases
- :mod:`~builder.propose.outputs`: where ``--output`` writes, and how the tool knows its own
- :mod:`~builder.propose.candidate`: the candidate directory, its build and gate, ``--apply``
"""
