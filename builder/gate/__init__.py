"""The gate: run the self-test in an image (:mod:`.image`) or a SIF (:mod:`.sif`) and make a
verdict of its report (:mod:`.ending`, the one ending both share).

:mod:`.plan` decides what a run needs (phases, self-test arguments, the GPUs expected, the
architecture), :mod:`.record` is the typed ``gate`` section the verdict carries, and
:mod:`.summary` prints it. This package module imports none of them (:mod:`builder.gate.verdicts`
reads :mod:`.record`, and the gate modules read :mod:`builder.gate.verdicts`).
"""
