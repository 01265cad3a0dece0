"""The train check's in-image program (docs/train-check.md): :mod:`.main` (the command line and
the report), :mod:`.stages` (what ``verl.trainer.main_ppo`` does before the first GPU, stage by
stage) and :mod:`.rules` (verl's messages -> the override that fixes them). Standard library
only, and nothing of build-env: it runs with the image's Python and verl, shipped as one zip
application (:func:`builder.train.checker_bytes`) that the host copies into the container, binds
into a SIF's run or writes into the Slurm job's directory."""
