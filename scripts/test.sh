#!/usr/bin/env bash
# Install what the tests need and run them all (the README's test command; .ci/run calls it).
#
# The tool is tested as users get it: the wheel is built from this checkout and installed into a
# fresh venv, and CLI-level tests run that venv's `build-env` from a directory outside the
# checkout (VERL_ENV_CLI). Daemons (dockerd, docker-registry, slurmctld/slurmd) are started by
# the test fixtures with private sockets and directories, and stopped by PID at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
scripts/os-packages.sh || exit 1
command -v uv >/dev/null || python3 -m pip install -q --disable-pip-version-check uv || exit 1
root=$(mktemp -d /var/tmp/verl-env-test.XXXXXX) || exit 1
trap 'rm -rf "$root"' EXIT
uv build --wheel -q -o "$root/dist" . || exit 1
wheel=$(ls "$root"/dist/verl_env-*.whl) || exit 1
uv venv -q --seed --python "$(command -v python3)" "$root/venv" || exit 1
uv pip install -q --python "$root/venv/bin/python" "$wheel[test]" || exit 1
export VERL_ENV_CLI="$root/venv/bin/build-env" PATH="$root/venv/bin:$PATH"
"$root/venv/bin/python" -m pytest -rs "$@"
status=$?
# pytest exit 5 means no test was collected: that is a failure here, never a pass.
[ "$status" -eq 5 ] && { echo "test.sh: no tests collected" >&2; exit 1; }
exit "$status"
