"""Who launched us: standalone, torchrun (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/PORT) or an
srun step (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODELIST + MASTER_ADDR/PORT).
Pure: everything is read from the environment mapping passed in."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

DEFAULT_PORT = 29500


class LauncherError(ValueError):
    """Launcher variables are inconsistent or incomplete."""


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a multi-rank run (world_size 1 when standalone)."""

    launcher: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    nodelist: tuple[str, ...] = ()

    @property
    def distributed(self) -> bool:
        """More than one rank: the collective spans all of them."""
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def expand_nodelist(text: str) -> list[str]:
    """Slurm host list: ``node[01-03,07],gpu5`` → node01 node02 node03 node07 gpu5."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not m:
            hosts.append(part.strip())
            continue
        prefix, ranges, rest = m.groups()
        tails = expand_nodelist(rest) if "[" in rest else [rest]
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            nums = [lo] if not hi else [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
            hosts += [f"{prefix}{n}{t}" for n in nums for t in tails]
    return [h for h in hosts if h]


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        raise LauncherError(f"{key} must be an integer, got {env.get(key)!r}") from None


def detect(env: Mapping[str, str], force: str = "auto") -> RankInfo:
    """torchrun (RANK and WORLD_SIZE set) wins over srun (an srun *step*: SLURM_PROCID plus
    SLURM_STEP_ID, so a batch script's own SLURM_PROCID=0 is not mistaken for a rank)."""
    if force == "standalone":
        return RankInfo("standalone")
    torchrun = "RANK" in env and "WORLD_SIZE" in env
    slurm = "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)
    if force == "torchrun" or (force == "auto" and torchrun):
        for key in ("RANK", "WORLD_SIZE"):
            if key not in env:
                raise LauncherError(f"torchrun mode needs {key}")
        world = _int(env, "WORLD_SIZE")
        info = RankInfo("torchrun", _int(env, "RANK"), world,
                        _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                        env.get("MASTER_ADDR"),
                        _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None)
        if world > 1 and (info.master_addr is None or info.master_port is None):
            raise LauncherError("torchrun mode needs MASTER_ADDR and MASTER_PORT")
        return _validated(info)
    if force == "slurm" or (force == "auto" and slurm):
        world_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        if world_key not in env or "SLURM_PROCID" not in env:
            raise LauncherError("srun mode needs SLURM_PROCID and SLURM_NTASKS")
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                                or env.get("SLURM_NODELIST") or "")
        addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else None)
        world = _int(env, world_key)
        if world > 1 and addr is None:
            raise LauncherError("srun mode needs MASTER_ADDR or SLURM_NODELIST")
        port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT
        return _validated(RankInfo("slurm", _int(env, "SLURM_PROCID"), world,
                                   _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                                   addr, port, tuple(nodes)))
    return RankInfo("standalone")


def _validated(info: RankInfo) -> RankInfo:
    if info.world_size < 1 or not 0 <= info.rank < info.world_size or info.local_rank < 0:
        raise LauncherError(f"rank {info.rank} / world {info.world_size} / local rank "
                            f"{info.local_rank} are inconsistent")
    return info


def dist_env(info: RankInfo) -> dict[str, str]:
    """The env:// variables for torch.distributed in the collective subprocess."""
    env = {"RANK": str(info.rank), "WORLD_SIZE": str(info.world_size),
           "LOCAL_RANK": str(info.local_rank)}
    if info.master_addr:
        env["MASTER_ADDR"] = info.master_addr
    if info.master_port:
        env["MASTER_PORT"] = str(info.master_port)
    return env
