"""verl's messages -> the override that fixes them, and the batch sizes verl's checks accept
(pure: no verl import)."""

from __future__ import annotations

import re
from typing import Any, Callable


class Rejected(Exception):
    """A stage found something verl would refuse: ``message`` (verl's words), ``fix``."""

    def __init__(self, message: str, fix: str | None = None, **detail: Any) -> None:
        super().__init__(message)
        self.message, self.fix, self.detail = message, fix, detail



# ---- verl's messages -> the override that fixes them ---------------------------------------

def _micro(cfg: Any) -> int:
    """A micro batch per GPU that divides this shape's per-GPU mini batch (2, else 1)."""
    try:
        n_gpus = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        per_gpu = (cfg.actor_rollout_ref.actor.ppo_mini_batch_size
                   * cfg.actor_rollout_ref.rollout.n) // max(n_gpus, 1)
        return 2 if per_gpu >= 2 and per_gpu % 2 == 0 else 1
    except Exception:  # noqa: BLE001 - a suggestion only
        return 1


def _full(key: str) -> str:
    """verl's short section names in messages -> the hydra key."""
    for short, full in (("actor.", "actor_rollout_ref.actor."), ("ref.", "actor_rollout_ref.ref."),
                        ("rollout.", "actor_rollout_ref.rollout.")):
        if key.startswith(short):
            return full + key[len(short):]
    return key


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _batch_rules(cfg: Any) -> tuple[int, int, int, int]:
    """(rollout.n, the actor's data-parallel size, its micro batch per GPU, verl's minimal
    batch) of a composed config: validate_config's and the workers' normalisation."""
    a, n_gpus = cfg.actor_rollout_ref.actor, cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    micro = int(getattr(a, "ppo_micro_batch_size_per_gpu", None) or 1)
    n = int(cfg.actor_rollout_ref.rollout.n)
    m = getattr(a, str(getattr(a, "strategy", "")), None)  # the model-parallel engine's section
    if m is not None and hasattr(m, "pipeline_model_parallel_size"):
        dp = n_gpus // max(1, int(m.tensor_model_parallel_size) * int(
            m.pipeline_model_parallel_size) * int(getattr(m, "context_parallel_size", 1) or 1))
        return n, max(dp, 1), micro, max(dp, 1) * micro
    sp = int(getattr(a, "ulysses_sequence_parallel_size", 1) or 1)
    return n, max(n_gpus // sp, 1), micro, n_gpus


def fit_batches(cfg: Any, rows: int | None = None) -> tuple[int, int] | None:
    """The largest (data.train_batch_size, ppo_mini_batch_size) at most the current ones (and
    ``rows``) that verl's batch rules take: train x n a multiple of the minimal batch, the mini
    batch dividing the train batch with mini x n / dp a positive multiple of the micro batch.
    None when no batch that small can hold them (more rows are needed)."""
    n, dp, micro, minimal = _batch_rules(cfg)
    top = min(int(cfg.data.train_batch_size), rows if rows is not None else 1 << 30)
    mini_top = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    for batch in range(top, 0, -1):
        if (batch * n) % minimal:
            continue
        for mini in range(min(batch, mini_top), 0, -1):
            per = mini * n
            if batch % mini == 0 and per % dp == 0 and (per // dp) % micro == 0:
                return batch, mini
    return None


def least_batch(cfg: Any) -> int:
    """The smallest train batch verl's batch rules take on this shape (rows needed)."""
    n, dp, micro, minimal = _batch_rules(cfg)
    batch = 1
    while (batch * n) % minimal or (batch * n) % dp or ((batch * n) // dp) % micro:
        batch += 1
    return batch


def fit_fix(cfg: Any, rows: int | None = None) -> str:
    """The batch sizes to set (both, so that the fix passes the same checks), or the rows to
    add."""
    try:
        fit = fit_batches(cfg, rows)
    except Exception:  # noqa: BLE001 - a suggestion only
        return "a smaller data.train_batch_size, or more train rows"
    if fit is None:
        return f"at least {least_batch(cfg)} train rows (this cluster shape's smallest batch)"
    return (f"data.train_batch_size={fit[0]} "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={fit[1]}")


FIXES: list[tuple[str, Callable[[re.Match, Any], str]]] = [
    (r"Please set at least one of '([\w.]+?)' or '([\w.]+)'",
     lambda m, c: f"{_full(m[2])}={_micro(c)}"),
    (r"You have set both '([\w.]+)' AND",
     lambda m, c: f"{_full(m[1])}=null"),
    (r"real_train_batch_size \((\d+)\) must be divisible by minimal possible batch size \((\d+)\)",
     lambda m, c: "data.train_batch_size="
                  f"{round_up(c.data.train_batch_size, int(m[2]))}"),
    (r"train_batch_size \((\d+)\) must be >= actor.ppo_mini_batch_size \((\d+)\)",
     lambda m, c: fit_fix(c)),
    (r"ppo_mini_batch_size \((\d+)\) must be divisible by ppo_micro_batch_size \((\d+)\)",
     lambda m, c: f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={_micro(c)}"),
    (r"Missing mandatory value: ([\w.]+)",
     lambda m, c: f"{m[1]}=VALUE"),
    (r"Could not override '([\w.]+)'[\s\S]*?Key '[\w.]+' is not in struct",
     lambda m, c: f"+{m[1]}=VALUE (a key new to verl's config; check its spelling)"),
    (r"Key '([\w.]+)' not in '\w+'",
     lambda m, c: f"a key verl's config does not have: {m[1]} (check its spelling)"),
]


def fix_for(message: str, cfg: Any) -> str | None:
    """The override that fixes ``message``, where a rule knows it."""
    for pattern, make in FIXES:
        m = re.search(pattern, message)
        if m:
            try:
                return make(m, cfg)
            except Exception:  # noqa: BLE001 - a suggestion only
                return None
    return None


def root_message(exc: BaseException) -> str:
    """verl's own words: the innermost cause of a hydra/omegaconf wrapper, its key kept."""
    inner = exc
    while inner.__cause__ is not None and inner.__cause__ is not inner:
        inner = inner.__cause__
    text = str(inner).strip() or type(inner).__name__
    full_key = getattr(exc, "full_key", None) or getattr(inner, "full_key", None)
    if full_key and full_key not in text:
        text += f" (full_key: {full_key})"
    return text

