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
# setuptools reuses build/lib and build/bdist.*: a stale file there would slip into the wheel
rm -rf build/lib build/bdist.*
uv build --wheel -q -o "$root/dist" . || exit 1
wheel=$(ls "$root"/dist/verl_env-*.whl) || exit 1
uv venv -q --seed --python "$(command -v python3)" "$root/venv" || exit 1
uv pip install -q --python "$root/venv/bin/python" "${wheel}[test]" || exit 1
export VERL_ENV_CLI="$root/venv/bin/build-env" PATH="$root/venv/bin:$PATH"
pytest=("$root/venv/bin/python" -m pytest -rs -p no:cacheprovider)

# pytest exit 5 means no test was collected: that is a failure here, never a pass.
verdict() {
  [ "$2" -eq 5 ] && { echo "test.sh: $1: no tests collected" >&2; return 1; }
  return "$2"
}

if [ $# -gt 0 ]; then
  "${pytest[@]}" "$@"
  verdict "pytest $*" $?
  exit
fi

# The whole suite, in two independent groups run side by side, each with its own engine: the
# builds under QEMU emulation (arm64; long, mostly waiting on one emulated core) and the rest.
# The emulated group's output follows the other's. Their temporary directories stay under /tmp:
# the Slurm tests bind job directories into images run by ch-run, which binds the host's /tmp
# (a bind destination elsewhere must exist in the read-only image).
tmp=$(mktemp -d /tmp/verl-env-pytest.XXXXXX) || exit 1
"${pytest[@]}" --basetemp="$tmp/emulated" -m emulated >"$root/emulated.log" 2>&1 &
emulated_pid=$!
trap 'kill -INT "$emulated_pid" 2>/dev/null; wait "$emulated_pid"; rm -rf "$root" "$tmp"' EXIT
"${pytest[@]}" --basetemp="$tmp/main" -m "not emulated"
verdict "the main group" $?
main_status=$?
wait "$emulated_pid"
emulated_status=$?
echo "==================== the emulated group (-m emulated) ===================="
cat "$root/emulated.log"
verdict "the emulated group" "$emulated_status"
emulated_status=$?
[ "$main_status" -eq 0 ] && [ "$emulated_status" -eq 0 ]
