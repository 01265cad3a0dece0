"""``python -m verl_env_selftest``: run the self-test (see ``cli.main``)."""

from .cli import main

raise SystemExit(main())
