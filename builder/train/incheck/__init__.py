"""verl-env train check: verl's own checks of one training command, inside the image, no GPUs.

    python3 incheck.pyz --nnodes N --gpus-per-node G [--json PATH] [--engine NAME=MODULE]...
                       -- <main_ppo hydra overrides>

Runs with the image's verl (this package, zipped into one file, is copied into the image or
bound in; it imports nothing of build-env). It does what ``verl.trainer.main_ppo`` does before
the first GPU is needed:

  compose   hydra composes verl's ``ppo_trainer`` config with the overrides (as main_ppo's
            ``@hydra.main`` does), then ``auto_set_device``
  validate  verl's ``validate_config`` ("All configuration checks passed")
  trainer   the modules the trainer's run imports (v1: transfer_queue and the trainer mode;
            legacy: main_ppo_v0) and verl's rollout code for the engine (up to the GPU driver)
  model     the model's config, tokenizer and processor from ``actor_rollout_ref.model.path``
            (verl's HFModelConfig, as the trainer's tokenizer step)
  train_data / val_data
            the row count, and the first row through verl's dataset class (create_rl_dataset:
            chat template, prompt length against data.max_prompt_length, filtering)
  reward    the reward manager class and the score function for the row's data_source, called
            on the row's ground truth
  cluster   nnodes x GPUs per node against the command's trainer.nnodes x n_gpus_per_node, the
            rollout's parallel sizes and the batch against the train rows
  gpu       stop: worker groups, weights, the rollout engine and Ray placement need GPUs

Prints one JSON document (schema verl-env/train-check/v1, level "config") on stdout; verl's own
output goes to stderr. Exit 0 pass, 1 rejected (a stage failed: verl's message quoted, the
override that fixes it named), 3 could not run (verl not importable, the checker broke).

The modules (docs/train-check.md): :mod:`.main` (the run and its report), :mod:`.args` (the
command line), :mod:`.stages` (what ``verl.trainer.main_ppo`` does before the first GPU, stage by
stage) and :mod:`.rules` (verl's messages -> the override that fixes them). Standard library
only, and nothing of build-env: it runs with the image's Python and verl, shipped as one zip
application (:func:`builder.train.checker_bytes`) that the host copies into the container, binds
into a SIF's run or writes into the Slurm job's directory.
"""

# the report's schema name; the host (builder.train) reads the report by it
SCHEMA = "verl-env/train-check/v1"
