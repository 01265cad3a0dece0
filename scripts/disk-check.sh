#!/usr/bin/env bash
# Does this machine hold what a whole `scripts/test.sh` run writes? One line either way; exit 0
# when it does, 3 when a filesystem is short (test.sh then stops before it starts anything).
#
# What a whole run writes, in GB, at its peak (measured 2026-12-01, docs/testing.md: 42.3 GB in
# all, with the heavy group building the SGLang stack): the groups' engines under /var/tmp (data
# roots, 32 at that minute, the SGLang stack's 21 of it) with the tests' wheel cache and the
# wheel's venvs (~2), the pytest temporary directories under /tmp (~3), and the tests' caches
# (uv, the debootstrap bases, enroot, the host venvs: ~5) under XDG_CACHE_HOME (~/.cache), each
# with a little headroom. Directories on one filesystem add up. VERL_ENV_TEST_DISK_GB=N: the
# need of each filesystem instead; 0 turns the check off.
set -uo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}
[ -d "$cache" ] || cache=$HOME  # a fresh machine: the run makes it
declare -A disk_need=([/var/tmp]=36 [/tmp]=4 ["$cache"]=5)
[ "${VERL_ENV_TEST_DISK_GB:-}" = 0 ] && exit 0
declare -A need=() avail=() names=()
short="" ok=""
for dir in "${!disk_need[@]}"; do
  read -r free mount < <(df -Pk "$dir" | awk 'NR == 2 {print int($4 / 1048576), $6}') \
    || { echo "disk-check.sh: cannot read the free space of $dir (df)" >&2; exit 3; }
  need[$mount]=$(( ${need[$mount]:-0} + disk_need[$dir] ))
  avail[$mount]=$free
  names[$mount]="${names[$mount]:+${names[$mount]} and }$dir"
done
for mount in "${!need[@]}"; do
  want=${VERL_ENV_TEST_DISK_GB:-${need[$mount]}}
  if [ "${avail[$mount]}" -lt "$want" ]; then
    line="${names[$mount]} (on $mount): ${avail[$mount]} GB free, the run needs $want GB"
    short="${short:+$short; }$line"
  fi
  ok="${ok:+$ok; }${names[$mount]} (on $mount): ${avail[$mount]} GB free of $want GB needed"
done
if [ -n "$short" ]; then
  echo "test.sh: not enough disk for a whole run: $short (free space, or set" \
       "VERL_ENV_TEST_DISK_GB)" >&2
  exit 3
fi
echo "test.sh: disk ok: $ok"
