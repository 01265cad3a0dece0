"""The self-test's phases, one module each (stdlib at import time; each phase imports the image's packages only inside its steps)."""
