#!/usr/bin/env bash
# Install what the tests need and run them all (the README's test command; .ci/run calls it).
#
# The tool is tested as users get it: the wheel is built from this checkout and installed into a
# fresh venv, and CLI-level tests run that venv's `build-env` from a directory outside the
# checkout (VERL_ENV_CLI). Daemons (dockerd, docker-registry, slurmctld/slurmd) are started by
# the test fixtures with private sockets and directories, and stopped by PID at the end.
#
# Every skip is held against tests/expected-skips.txt (--expected-skips): a skip the reviewed list
# does not name fails its group, one line per skip. Before a whole run starts, the disk must hold
# what the run writes (scripts/disk-check.sh); a run that would run out of space mid-way stops
# first, in one line, exit 3.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# A whole run first checks that the disk holds what it writes (scripts/disk-check.sh).
[ $# -gt 0 ] || scripts/disk-check.sh || exit 3

scripts/os-packages.sh || exit 1
command -v uv >/dev/null || python3 -m pip install -q --disable-pip-version-check uv || exit 1
root=$(mktemp -d /var/tmp/verl-env-test.XXXXXX) || exit 1
trap 'rm -rf "$root"' EXIT
# setuptools reuses build/lib and build/bdist.*: a stale file there would slip into the wheel
rm -rf build/lib build/bdist.*
# uv's own temporary files (the lock file of each setuptools build, which uv leaves behind) go
# under $root, removed at exit, not into /tmp
mkdir "$root/tmp" || exit 1
TMPDIR="$root/tmp" uv build --wheel -q -o "$root/dist" . || exit 1
wheel=$(ls "$root"/dist/verl_env-*.whl) || exit 1
TMPDIR="$root/tmp" uv venv -q --seed --python "$(command -v python3)" "$root/venv" || exit 1
# Bytecode compiled once here: every `build-env` a test starts would otherwise compile its
# modules (and requests', docker's, jsonschema's...) again where PYTHONDONTWRITEBYTECODE is set.
TMPDIR="$root/tmp" uv pip install -q --compile-bytecode --python "$root/venv/bin/python" \
    "${wheel}[test]" || exit 1
export VERL_ENV_CLI="$root/venv/bin/build-env" PATH="$root/venv/bin:$PATH"
pytest=("$root/venv/bin/python" -m pytest -rs -p no:cacheprovider --durations=15
        --expected-skips tests/expected-skips.txt)

# pytest exit 5 means no test was collected: that is a failure here, never a pass. An unexpected
# skip makes pytest itself exit 1, naming the skip (tests/support/skips.py).
verdict() {
  [ "$2" -eq 5 ] && { echo "test.sh: $1: no tests collected" >&2; return 1; }
  return "$2"
}

if [ $# -gt 0 ]; then
  "${pytest[@]}" "$@"
  verdict "pytest $*" $?
  exit
fi

# The whole suite, in six independent groups run side by side, each with its own engine where it
# needs one: the builds under QEMU emulation (arm64; long, mostly on one emulated core), the jobs
# on the real two-node Slurm (mostly waiting on daemons and Ray start-up), the Docker-heavy runs
# that need no CPU fixture image (-m heavy: vendor bases, the cuda-shaped fixture, the ABI phase in
# real images, the SIF conversions and registry publishes of the small layered image with their
# faults), the core (tests/core: the pure core and the CLI, no engine), the unit group (every
# other test that needs no engine and no registry: the CLI, the self-test, the job scripts...),
# and the rest (the engine and registry tests on the CPU fixture image). The machine is CPU-bound
# while they run; the split keeps any one group from running alone, on one busy core, long after
# the others ended (docs/testing.md). A test that uses an engine fixture without a marker that
# keeps it out of the engine-less groups fails the collection (tests/support/groups.py). The side
# groups' output follows the main one's. Their temporary directories stay under /tmp: the Slurm
# tests bind job directories into images run by ch-run, which binds the host's /tmp (a bind
# destination elsewhere must exist in the read-only image).
tmp=$(mktemp -d /tmp/verl-env-pytest.XXXXXX) || exit 1
# The checkout's own modules byte-compiled once, before the groups start. Pytest imports builder/
# and tests/ from the checkout (its rootdir is on sys.path), and where PYTHONDONTWRITEBYTECODE is
# set (as on the machines CI runs on) each group would compile them from source and rewrite the
# asserts of every test module again: two thirds of a group's collection, six times over
# (docs/testing.md). compileall writes the plain byte code (not under tests/fixtures: its
# packages are build inputs, hashed as directories); one collection with writing allowed leaves
# pytest's rewritten test modules, which every group then reads.
"$root/venv/bin/python" -m compileall -q -j 0 -x 'tests/fixtures' builder tests >/dev/null \
  || exit 1
env -u PYTHONDONTWRITEBYTECODE -u VERL_ENV_TEST_CPU "$root/venv/bin/python" -m pytest \
  -p no:cacheprovider --collect-only -q >/dev/null 2>&1 || true
# each group's CPU, test by test, in a cgroup of its own (tests/support/cpuacct.py)
export VERL_ENV_TEST_CPU="${VERL_ENV_TEST_CPU:-$root/cpu}"
# the CPU fixture image built once, by the main group, and gated by each group that needs it in
# its own engine (tests/support/shared_image.py)
export VERL_ENV_TEST_SHARE="$root/share" VERL_ENV_TEST_SHARE_BUILDER=main
declare -A side=([emulated]="emulated" [slurm]="slurm and not emulated"
                 [heavy]="heavy and not slurm and not emulated"
                 [core]="not slurm and not emulated and not heavy"
                 [unit]="not slurm and not emulated and not heavy and not docker and not registry")
# core: one directory; unit: everything else (the main group ignores tests/core too)
declare -A where=([core]="tests/core" [unit]="--ignore=tests/core")
declare -A pids=()
for name in "${!side[@]}"; do
  # shellcheck disable=SC2086  # where: one path or none
  "${pytest[@]}" --basetemp="$tmp/$name" -m "${side[$name]}" ${where[$name]:-} \
    >"$root/$name.log" 2>&1 &
  pids[$name]=$!
done
# shellcheck disable=SC2317  # called by the EXIT trap
stop_side_groups() {
  local pid
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null; done
  wait
  rm -rf "$root" "$tmp"
}
trap stop_side_groups EXIT
"${pytest[@]}" --basetemp="$tmp/main" \
  -m "(docker or registry) and not emulated and not slurm and not heavy" --ignore=tests/core \
  2>&1 | tee "$root/main.log"
verdict "the main group" "${PIPESTATUS[0]}"
status=$?
for name in core unit heavy slurm emulated; do
  wait "${pids[$name]}"
  group_status=$?
  echo "==================== the $name group (-m '${side[$name]}'${where[$name]:+ ${where[$name]}})" \
       "===================="
  cat "$root/$name.log"
  verdict "the $name group" "$group_status" || status=1
done
# each group's 15 slowest tests into docs/testing.md, by the run itself
scripts/slowest.py --cpu "$VERL_ENV_TEST_CPU" main="$root/main.log" core="$root/core.log" unit="$root/unit.log" \
  heavy="$root/heavy.log" slurm="$root/slurm.log" emulated="$root/emulated.log" || true
exit "$status"
