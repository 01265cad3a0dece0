"""verl-env train check, run INSIDE the image with the image's verl (draft: API only).

    python3 incheck.py --nnodes N --gpus-per-node G -- <main_ppo hydra overrides>

Prints one JSON document (schema verl-env/train-check/v1) on stdout; exit 0 pass, 1 rejected,
3 could not run."""

import json
import sys

print(json.dumps({"schema": "verl-env/train-check/v1", "level": "config", "status": "error",
                  "stages": [], "error": "the checker is not implemented yet"}))
sys.exit(3)
