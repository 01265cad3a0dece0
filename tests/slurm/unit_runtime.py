"""A recording stand-in for ``apptainer``, for the unit tests of the argv the job script builds
(test_render) and of ``doctor``'s runtime probe (test_doctor) only. The real-Slurm tests
(test_sbatch_real) run the fixture image through the real ``ch-run`` instead."""

from __future__ import annotations

from pathlib import Path

import pytest

# A stand-in for apptainer: `pull DEST SRC` copies $FAKE_SIF_STORE/<digest hex> (or a path),
# `exec [--nv|--rocm] [-B SRC[:DST]]... SIF CMD...` checks what apptainer would check (the SIF
# and every bind source exist) and runs CMD on the host. Every call is logged. Test switches:
# $FAKE_NODE_ENV_DIR/NODE.env (KEY=VALUE lines exported on that node only) and
# FAKE_RUNTIME_BROKEN_NODE=NODE (exec fails there, as an unmountable image would).
STANDIN_RUNTIME = r"""#!/usr/bin/env bash
set -euo pipefail
echo "${SLURMD_NODENAME:-batch} $*" >>"${FAKE_RUNTIME_LOG:-/dev/null}"
cmd=${1:-}
shift || true
case $cmd in
  version|--version) echo "apptainer version 0.0.0-standin" ;;
  pull)
    dest=$1 src=$2
    [ ! -e "$dest" ] || { echo "FATAL: $dest exists" >&2; exit 255; }
    case $src in
      *@sha256:*) file="$FAKE_SIF_STORE/${src##*@sha256:}" ;;
      *) file=$src ;;
    esac
    sleep "${FAKE_PULL_SECONDS:-0}"
    cp "$file" "$dest"
    ;;
  exec)
    while [ $# -gt 0 ]; do
      case $1 in
        --nv|--rocm|--cleanenv|--contain) shift ;;
        -B|--bind)
          src=${2%%:*}
          [ -e "$src" ] || { echo "FATAL: bind source $src does not exist" >&2; exit 255; }
          shift 2 ;;
        -*) echo "standin: unknown option $1" >&2; exit 255 ;;
        *) break ;;
      esac
    done
    sif=$1
    shift
    [ -f "$sif" ] || { echo "FATAL: image $sif not found" >&2; exit 255; }
    # a node-specific environment (as a node's prolog or module setup could leave it)
    node_env="${FAKE_NODE_ENV_DIR:-/nonexistent}/${SLURMD_NODENAME:-none}.env"
    if [ -f "$node_env" ]; then
      while IFS= read -r line; do export "${line?}"; done <"$node_env"
    fi
    if [ -n "${FAKE_RUNTIME_BROKEN_NODE:-}" ] && [ "${SLURMD_NODENAME:-}" = "$FAKE_RUNTIME_BROKEN_NODE" ]; then
      echo "FATAL: could not mount $sif on this node (FAKE_RUNTIME_BROKEN_NODE)" >&2
      exit 255
    fi
    exec "$@"
    ;;
  *) echo "standin: unsupported command $cmd" >&2; exit 255 ;;
esac
"""


@pytest.fixture(scope="session")
def standin_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the stand-in ``apptainer``; put it first on PATH."""
    bindir = tmp_path_factory.mktemp("standin-bin")
    runtime = bindir / "apptainer"
    runtime.write_text(STANDIN_RUNTIME)
    runtime.chmod(0o755)
    return bindir
