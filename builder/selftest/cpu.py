"""Functional CPU checks: tensordict ``"k" in td`` membership (broken on old/arm64
fallback versions) and an N-rank gloo all-reduce (FileStore rendezvous, exact result)."""

from __future__ import annotations

from .manifest import declared
from .phase import Run, Step, rank_timeout
from .ranks import decide_allreduce, spawn_local
from .report import FAIL, PASS, Check

PHASE = "cpu"
GLOO_CHECK_BYTES = 4 << 20
GLOO_BW_BYTES = 16 << 20


def decide_membership(has_key: bool | None, has_missing: bool | None,
                      error: str | None, version: str | None) -> Check:
    """``"a" in td`` must be True and ``"b" in td`` False; tensordict < 0.4 raises
    "TensorDict does not support membership checks with the `in` keyword"."""
    cid = "cpu.tensordict_membership"
    if error is not None:
        return Check(cid, PHASE, FAIL, value=version, reason=error)
    if has_key is True and has_missing is False:
        return Check(cid, PHASE, PASS, value=version, reason='"a" in td and "b" not in td')
    return Check(cid, PHASE, FAIL, value=version,
                 reason=f'wrong membership: "a" in td -> {has_key}, "b" in td -> {has_missing}')


def tensordict_step(run: Run) -> Check:
    """Build a one-key TensorDict and test membership."""
    try:
        import tensordict  # type: ignore[import-not-found]
        import torch  # type: ignore[import-not-found]
        from tensordict import TensorDict  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001
        return decide_membership(None, None, f"import failed: {type(e).__name__}: {e}", None)
    version = getattr(tensordict, "__version__", None)
    try:
        td = TensorDict({"a": torch.zeros(1)}, batch_size=[1])
        return decide_membership("a" in td, "b" in td, None, version)
    except Exception as e:  # noqa: BLE001 - NotImplementedError on tensordict < 0.4
        return decide_membership(None, None, f"{type(e).__name__}: {e}", version)


def gloo_step(run: Run) -> Check:
    """Spawn ``--gloo-ranks`` ranks (default 2) and all-reduce over gloo."""
    opts = run.options
    world = int(opts.get("gloo_ranks", 2))
    res = spawn_local("gloo", world, ["cpu"] * world, GLOO_CHECK_BYTES, GLOO_BW_BYTES,
                      iters=3, warmup=1, timeout=rank_timeout(run, PHASE),
                      workdir=run.ctx.get("workdir"))
    run.fact("cpu.gloo_world", world)
    run.fact("cpu.gloo_transport", "gloo/tcp")
    return decide_allreduce("cpu.gloo_allreduce", PHASE, res, transport="gloo/tcp")


def plan(run: Run) -> list[Step]:
    """tensordict membership when the target has tensordict; gloo when it has torch."""
    steps = []
    if declared(run.manifest, "tensordict"):
        steps.append(Step(("cpu.tensordict_membership",), tensordict_step))
    if declared(run.manifest, "torch"):
        steps.append(Step(("cpu.gloo_allreduce",), gloo_step))
    return steps
