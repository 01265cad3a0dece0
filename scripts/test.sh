#!/usr/bin/env bash
# Install what the tests need and run them all (the README's test command; .ci/run calls it).
# Daemons (dockerd, docker-registry, slurmctld/slurmd) are started by the test fixtures with
# private sockets and directories, and stopped by PID when the session ends.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
scripts/os-packages.sh || exit 1
python3 -m pip install -q --disable-pip-version-check '.[test]' || exit 1
python3 -m pytest -rs "$@"
status=$?
# pytest exit 5 means no test was collected: that is a failure here, never a pass.
[ "$status" -eq 5 ] && { echo "test.sh: no tests collected" >&2; exit 1; }
exit "$status"
