"""verl-env train check: verl's own checks of one training command, inside the image, no GPUs.

    python3 incheck.py --nnodes N --gpus-per-node G [--json PATH] [--engine NAME=MODULE]...
                       -- <main_ppo hydra overrides>

Runs with the image's verl (this file is copied into the image or bound in; it imports nothing
of build-env). It does what ``verl.trainer.main_ppo`` does before the first GPU is needed:

  compose   hydra composes verl's ``ppo_trainer`` config with the overrides (as main_ppo's
            ``@hydra.main`` does), then ``auto_set_device``
  validate  verl's ``validate_config`` ("All configuration checks passed")
  trainer   the modules the trainer's run imports (v1: transfer_queue and the trainer mode;
            legacy: main_ppo_v0) and verl's rollout code for the engine (up to the GPU driver)
  model     the model's config, tokenizer and processor from ``actor_rollout_ref.model.path``
            (verl's HFModelConfig, as the trainer's tokenizer step)
  train_data / val_data
            the row count, and the first row through verl's dataset class (create_rl_dataset:
            chat template, prompt length against data.max_prompt_length, filtering)
  reward    the reward manager class and the score function for the row's data_source, called
            on the row's ground truth
  cluster   nnodes x GPUs per node against the command's trainer.nnodes x n_gpus_per_node, the
            rollout's parallel sizes and the batch against the train rows
  gpu       stop: worker groups, weights, the rollout engine and Ray placement need GPUs

Prints one JSON document (schema verl-env/train-check/v1, level "config") on stdout; verl's own
output goes to stderr. Exit 0 pass, 1 rejected (a stage failed: verl's message quoted, the
override that fixes it named), 3 could not run (verl not importable, the checker broke).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

SCHEMA = "verl-env/train-check/v1"
PASSED = "All configuration checks passed"
EXIT = {"pass": 0, "rejected": 1, "error": 3}
MANIFEST = "/opt/verl-env/manifest.json"


class Rejected(Exception):
    """A stage found something verl would refuse: ``message`` (verl's words), ``fix``."""

    def __init__(self, message: str, fix: str | None = None, **detail: Any) -> None:
        super().__init__(message)
        self.message, self.fix, self.detail = message, fix, detail


class Tee(io.TextIOBase):
    """stderr that also keeps what was written (verl prints its verdicts)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.kept = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


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


def _round_up(n: int, m: int) -> int:
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


def _fit_fix(cfg: Any, rows: int | None = None) -> str:
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
                  f"{_round_up(c.data.train_batch_size, int(m[2]))}"),
    (r"train_batch_size \((\d+)\) must be >= actor.ppo_mini_batch_size \((\d+)\)",
     lambda m, c: _fit_fix(c)),
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


# ---- the stages -------------------------------------------------------------------------------

class Check:
    """One run: the stages in order, each recorded; a stage that needs an earlier one's result
    is skipped, with the reason, when that one failed."""

    def __init__(self, args: Args, tee: Tee, tmp: str) -> None:
        self.args, self.tee, self.tmp = args, tee, tmp
        self.stages: list[dict[str, Any]] = []
        self.cfg: Any = None
        self.model: Any = None
        self.rows: dict[str, dict[str, Any]] = {}
        self.rows_count: dict[str, int] = {}

    def run(self, name: str, fn: Callable[[], dict[str, Any]], needs: tuple[str, ...] = ()
            ) -> None:
        failed = [n for n in needs if not self._ok(n)]
        if failed:
            self.stages.append({"name": name, "status": "skip",
                                "reason": f"needs {', '.join(failed)}, which did not pass"})
            return
        start = time.monotonic()
        entry: dict[str, Any] = {"name": name}
        try:
            entry.update(status="pass", **fn())
        except Rejected as r:
            entry.update(status="fail", message=r.message, **r.detail)
            if r.fix:
                entry["fix"] = r.fix
        except Exception as exc:  # noqa: BLE001 - verl's own refusal, quoted
            message = root_message(exc)
            entry.update(status="fail", error=type(exc).__name__, message=message)
            fix = fix_for(f"{exc}\n{message}", self.cfg)
            if fix:
                entry["fix"] = fix
            traceback.print_exc(file=sys.stderr)
        entry["seconds"] = round(time.monotonic() - start, 2)
        self.stages.append(entry)

    def _ok(self, name: str) -> bool:
        return any(s["name"] == name and s["status"] == "pass" for s in self.stages)

    # compose ----------------------------------------------------------------------------------
    def compose(self) -> dict[str, Any]:
        from hydra import compose, initialize_config_module
        from verl.utils.device import auto_set_device

        # main_ppo: @hydra.main(config_path="config", config_name="ppo_trainer") in
        # verl/trainer/main_ppo.py, i.e. the config module verl.trainer.config; a command's
        # --config-name=NAME (a Megatron target's ppo_megatron_trainer) picks another there
        name, overrides = config_name(self.args.overrides)
        with initialize_config_module("verl.trainer.config", version_base=None):
            cfg = compose(name, overrides=overrides)
        auto_set_device(cfg)
        self.cfg = cfg
        return {"overrides": len(overrides), "config_name": name,
                "device": str(cfg.trainer.device)}

    def validate(self) -> dict[str, Any]:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        mark = self.tee.kept.tell()
        use_ref, use_critic = need_reference_policy(self.cfg), need_critic(self.cfg)
        validate_config(config=self.cfg, use_reference_policy=use_ref, use_critic=use_critic)
        said = self.tee.kept.getvalue()[mark:]
        line = next((ln.strip() for ln in said.splitlines() if PASSED in ln), None)
        if line is None:
            raise Rejected(f"verl's validate_config returned without saying {PASSED!r}")
        return {"verl_says": line, "reference_policy": use_ref, "critic": use_critic}

    # the trainer's own imports ----------------------------------------------------------------
    def trainer(self) -> dict[str, Any]:
        cfg = self.cfg
        v1 = bool(cfg.trainer.get("use_v1", False))
        try:
            name = _trainer_imports(v1, str(cfg.trainer.get("v1", {}).get("trainer_mode", "")))
        except ModuleNotFoundError as exc:
            engine = str(cfg.actor_rollout_ref.rollout.name)  # its verl extra pulls verl-core in
            other = "trainer.use_v1=False (verl's legacy trainer)" if v1 and _imports_ok(
                False) else None
            raise Rejected(
                f"the trainer's run cannot start: {exc} (trainer.use_v1={v1}); verl declares "
                "it in its [verl-core] extra, which this image's verl pin lacks",
                fix=" or ".join(filter(None, [other, "an image whose verl pin has the "
                                              f"verl-core (or {engine}) extra"]))) from None
        return {"trainer": name,
                "rollout": self._engine(str(cfg.actor_rollout_ref.rollout.name))}

    def _engine(self, name: str) -> str:
        import importlib.util

        engines = self.args.engines  # the host's catalogue: rollout.name -> import name
        module = engines.get(name, name)
        if importlib.util.find_spec(module) is not None:
            return self._rollout_code(name)
        if self._cpu_image():
            return f"{name}: not installed (a cpu image has no rollout engine)"
        here = [n for n, m in engines.items() if importlib.util.find_spec(m) is not None]
        raise Rejected(f"actor_rollout_ref.rollout.name={name}: the {module} package is not "
                       "installed in this image", fix="actor_rollout_ref.rollout.name=<the "
                       f"engine this image has: {' or '.join(here or engines) or '?'}>")

    def _rollout_code(self, name: str) -> str:
        """verl's own rollout code for ``name`` imported as its workers import it when they
        start (``get_rollout_class`` and ``get_rollout_replica_class``): the engine's Python
        code up to the point where it would start on GPUs. An import that stops at the GPU
        driver's library is that point where no driver is installed; anywhere else it fails."""
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.replica import get_rollout_replica_class

        mode = str(self.cfg.actor_rollout_ref.rollout.get("mode") or "async")
        try:
            adapter = get_rollout_class(name, mode)
            replica = get_rollout_replica_class(name)
        except Exception as exc:  # noqa: BLE001 - verl raises ValueError for a missing engine too
            driver = _driver_library(str(exc))
            if driver and not os.path.exists("/dev/nvidiactl"):
                return (f"{name}: verl's rollout code imported up to {_raised_in(exc)}, which "
                        f"needs the GPU driver's {driver} (no GPU driver in this container); "
                        "not started: it needs GPUs")
            raise Rejected(f"actor_rollout_ref.rollout.name={name}: verl's {name} rollout "
                           f"code does not import in this image: {root_message(exc)}",
                           fix=f"an image whose {name} stack imports (build-env verify)") from None
        return (f"{name}: verl's {adapter.__module__}.{adapter.__name__} and "
                f"{replica.__name__} imported (not started: it needs GPUs)")

    def _cpu_image(self) -> bool:
        try:
            with open(self.args.manifest) as f:
                return json.load(f).get("accelerator") == "cpu"
        except (OSError, ValueError):
            return False

    # model ------------------------------------------------------------------------------------
    def model_stage(self) -> dict[str, Any]:
        from verl.utils.config import omega_conf_to_dataclass

        path = str(self.cfg.actor_rollout_ref.model.path)
        if not os.path.exists(os.path.expanduser(path)):
            raise Rejected(f"actor_rollout_ref.model.path={path}: no such directory in the "
                           "container", fix="actor_rollout_ref.model.path=<a model directory "
                           "the job binds>")
        model = omega_conf_to_dataclass(self.cfg.actor_rollout_ref.model)
        tok, hf = model.tokenizer, model.hf_config
        self.model = model
        vocab = getattr(hf, "vocab_size", None) or getattr(
            getattr(hf, "text_config", None), "vocab_size", None)
        if vocab is not None and len(tok) > vocab:
            raise Rejected(f"the tokenizer has {len(tok)} tokens but the model's embedding "
                           f"holds {vocab} (config.json vocab_size)",
                           fix="actor_rollout_ref.model.tokenizer_path=<the model's tokenizer>")
        if not getattr(tok, "chat_template", None):
            raise Rejected("the tokenizer has no chat template (verl applies one to every "
                           "prompt)", fix="a model directory whose tokenizer_config.json or "
                           "chat_template.jinja carries one (an instruct model)")
        return {"model_type": getattr(hf, "model_type", "?"),
                "architectures": list(getattr(hf, "architectures", None) or []),
                "vocab_size": vocab, "tokenizer": type(tok).__name__, "tokens": len(tok),
                "processor": type(model.processor).__name__ if model.processor else None}

    # data -------------------------------------------------------------------------------------
    def data_stage(self, split: str) -> dict[str, Any]:
        key = "train_files" if split == "train" else "val_files"
        files = self.cfg.data[key]
        files = [str(files)] if isinstance(files, str) else [str(f) for f in files]
        missing = [f for f in files if not os.path.isfile(os.path.expanduser(f))]
        if missing:
            raise Rejected(f"data.{key}: {', '.join(missing)}: no such file in the container",
                           fix=f"data.{key}=<a parquet file the job binds>")
        count = sum(_rows(f) for f in files)
        if count == 0:
            raise Rejected(f"data.{key}: {files[0]} has no rows")
        first = _first_row_file(files[0], self.tmp)
        row, length = self._through_dataset(first, split == "train")
        self.rows[split] = row
        return {"files": files, "rows": count, "prompt_tokens": length,
                "max_prompt_length": int(self.cfg.data.max_prompt_length),
                "data_source": row.get("data_source")}

    def _through_dataset(self, path: str, is_train: bool) -> tuple[dict[str, Any], int]:
        from verl.trainer.ppo.utils import create_rl_dataset

        data = self.cfg.data
        ds = create_rl_dataset([path], data, self.model.tokenizer, self.model.processor,
                               is_train=is_train, max_samples=-1)
        length = _prompt_tokens(ds, path)
        limit = int(data.max_prompt_length)
        if len(ds) == 0 or (length is not None and length > limit):
            raise Rejected(f"the first row's prompt is {length} tokens after the chat template, "
                           f"over data.max_prompt_length ({limit}); verl filters or refuses it",
                           fix=f"data.max_prompt_length={_round_up(length or limit + 1, 64)}")
        row = ds[0]
        if "raw_prompt" not in row:
            raise Rejected("verl's dataset gave no raw_prompt for the first row "
                           f"(data.prompt_key={data.get('prompt_key', 'prompt')})")
        return row, length if length is not None else -1

    # reward -----------------------------------------------------------------------------------
    def reward(self) -> dict[str, Any]:
        from verl.trainer.ppo.reward import get_custom_reward_fn, resolve_reward_manager_cls
        from verl.utils.reward_score import get_default_compute_score

        cfg = self.cfg
        manager = resolve_reward_manager_cls(cfg)
        custom = get_custom_reward_fn(cfg)
        score_fn = custom or get_default_compute_score(cfg.reward.reward_manager.name)
        out: dict[str, Any] = {"manager": manager.__name__,
                               "function": "custom" if custom else "verl default_compute_score"}
        for split, row in self.rows.items():
            source = row.get("data_source")
            truth = (row.get("reward_model") or {}).get("ground_truth")
            try:
                score = score_fn(source, f"#### {truth}", truth, row.get("extra_info"))
                if asyncio.iscoroutine(score):
                    score = asyncio.run(score)
            except NotImplementedError as exc:
                raise Rejected(f"no reward function for data_source {source!r} ({split}): "
                               f"{root_message(exc)}",
                               fix="reward.custom_reward_function.path=<a .py file with "
                                   "compute_score(data_source, solution_str, ground_truth, "
                                   "extra_info)>") from None
            out[f"{split}_score_of_ground_truth"] = score if isinstance(
                score, (int, float)) else str(score)
        return out

    # cluster ----------------------------------------------------------------------------------
    def cluster(self) -> dict[str, Any]:
        cfg, a = self.cfg, self.args
        want = (int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node))
        if want != (a.nnodes, a.gpus_per_node):
            raise Rejected(
                f"the command asks for trainer.nnodes={want[0]} x trainer.n_gpus_per_node="
                f"{want[1]} but the job has {a.nnodes} node(s) x {a.gpus_per_node} GPU(s)",
                fix=f"trainer.nnodes={a.nnodes} trainer.n_gpus_per_node={a.gpus_per_node}")
        n_gpus = a.nnodes * a.gpus_per_node
        ro = cfg.actor_rollout_ref.rollout
        sizes = {k: int(ro.get(k) or 1) for k in ("tensor_model_parallel_size",
                                                  "data_parallel_size",
                                                  "pipeline_model_parallel_size")}
        infer = sizes["tensor_model_parallel_size"] * sizes["data_parallel_size"] * sizes[
            "pipeline_model_parallel_size"]
        if n_gpus % infer:
            raise Rejected(f"rollout world_size: {n_gpus} is not divisible by infer_world_size: "
                           f"{infer} (rollout tp x dp x pp)",
                           fix="actor_rollout_ref.rollout.tensor_model_parallel_size=<a divisor "
                               f"of {n_gpus}>")
        batch = int(cfg.data.train_batch_size)
        rows = self.rows_count.get("train")
        if rows is not None and rows < batch:
            raise Rejected(f"data.train_batch_size ({batch}) is more than the {rows} train rows: "
                           "verl's dataloader drops the last partial batch, so no step runs",
                           fix=_fit_fix(cfg, rows))
        return {"n_gpus": n_gpus, "rollout_replicas": n_gpus // infer, **sizes,
                "train_batch_size": batch,
                "steps_per_epoch": rows // batch if rows is not None else None}

    def stop(self) -> dict[str, Any]:
        n = self.args.nnodes * self.args.gpus_per_node
        return {"reason": f"the next step places the worker groups on {n} GPU(s) through Ray, "
                          "loads the weights and starts the rollout engine: it needs GPUs"}

    def all(self) -> None:
        self.run("compose", self.compose)
        self.run("validate", self.validate, ("compose",))
        self.run("trainer", self.trainer, ("compose",))
        self.run("model", self.model_stage, ("compose",))
        self.run("train_data", lambda: self._data("train"), ("model",))
        self.run("val_data", lambda: self._data("val"), ("model",))
        self.run("reward", self.reward, ("train_data", "val_data"))
        self.run("cluster", self.cluster, ("compose",))

    def _data(self, split: str) -> dict[str, Any]:
        out = self.data_stage(split)
        self.rows_count[split] = out["rows"]
        return out


def config_name(words: list[str]) -> tuple[str, list[str]]:
    """hydra's ``--config-name NAME`` (or ``=NAME``, ``-cn``) out of a command's overrides:
    (the name, ppo_trainer when none; the overrides left)."""
    name, out, rest = "ppo_trainer", [], list(words)
    while rest:
        word = rest.pop(0)
        flag, eq, value = word.partition("=")
        if flag in ("--config-name", "-cn"):
            name = value if eq else (rest.pop(0) if rest else name)
        else:
            out.append(word)
    return name, out


def _trainer_imports(v1: bool, mode: str) -> str:
    """Import what main_ppo's TaskRunner imports when it starts; the trainer's name."""
    import importlib

    if v1:
        importlib.import_module("transfer_queue")
        from verl.trainer.ppo.v1 import get_trainer_cls

        return f"v1 {mode}: {get_trainer_cls(mode).__name__}"
    from verl.trainer.main_ppo_v0 import TaskRunner

    return f"legacy: {TaskRunner.__name__} (main_ppo_v0)"


def _driver_library(message: str) -> str | None:
    """The GPU driver's library an import failed on (libcuda.so.1, libnvidia-ml.so.1), if any:
    it exists only where the driver is installed."""
    m = re.search(r"\b(libcuda\.so(?:\.\d+)*|libnvidia-[\w-]+\.so(?:\.\d+)*)", message)
    return m.group(1) if m else None


def _raised_in(exc: BaseException) -> str:
    """The installed package whose code raised ``exc`` (its innermost site-packages frame)."""
    found, tb = "an installed package", exc.__traceback__
    while tb is not None:
        parts = tb.tb_frame.f_code.co_filename.split(os.sep)
        if "site-packages" in parts[:-1]:
            found = parts[parts.index("site-packages") + 1].removesuffix(".py")
        tb = tb.tb_next
    return found


def _imports_ok(v1: bool) -> bool:
    try:
        _trainer_imports(v1, "sync")
        return True
    except ImportError:
        return False


def _rows(path: str) -> int:
    """Rows of a parquet (from its footer) or JSON-lines file."""
    path = os.path.expanduser(path)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _first_row_file(path: str, tmp: str) -> str:
    """The first row of ``path`` as a file of its own kind (verl's dataset tokenizes every row
    it is given: one row keeps the check in seconds on a large file)."""
    path = os.path.expanduser(path)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        table = pf.read_row_group(0).slice(0, 1)
        out = os.path.join(tmp, f"first-{len(os.listdir(tmp))}.parquet")
        pq.write_table(table, out)
        return out
    out = os.path.join(tmp, f"first-{len(os.listdir(tmp))}{os.path.splitext(path)[1]}")
    with open(path, "rb") as src, open(out, "wb") as dst:
        dst.write(next(line for line in src if line.strip()))
    return out


def _prompt_tokens(ds: Any, path: str) -> int | None:
    """The first row's prompt length as verl's filter counts it (chat template, generation
    prompt, tokenized)."""
    import datasets

    raw = datasets.load_dataset("parquet" if path.endswith(".parquet") else "json",
                                data_files=path)["train"][0]
    messages = raw[ds.prompt_key]
    kwargs = dict(ds.apply_chat_template_kwargs or {})
    for k in ("tokenize", "return_dict", "return_tensors"):
        kwargs.pop(k, None)
    ids = ds.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           **kwargs)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids)


USAGE = ("usage: incheck.py --nnodes N --gpus-per-node G [--json PATH] [--manifest PATH] "
         "[--engine NAME=MODULE]... -- OVERRIDE...")


@dataclass
class Args:
    """The command line (parsed by hand: an in-image program, no argparse in builder/ but the
    command layers)."""

    nnodes: int = 0
    gpus_per_node: int = 0
    json: str | None = None
    manifest: str = MANIFEST
    # rollout engines: verl's rollout.name -> the module that engine installs (the host passes
    # its catalogue's, builder.train.shapes.engine_args; a name not given is its own module)
    engines: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Args:
    """``--nnodes N --gpus-per-node G [--json PATH] [--manifest PATH] [--engine NAME=MODULE]...
    -- OVERRIDE...``;
    SystemExit(2) with the usage on anything else."""
    args, rest = Args(), list(argv)
    if "--" in rest:
        args.overrides, rest = rest[rest.index("--") + 1:], rest[:rest.index("--")]
    names = {"--nnodes": "nnodes", "--gpus-per-node": "gpus_per_node", "--json": "json",
             "--manifest": "manifest"}
    while rest:
        flag = rest.pop(0)
        if flag in ("-h", "--help"):
            print(USAGE + "\n\n" + (__doc__ or ""), file=sys.stderr)
            raise SystemExit(0)
        known = flag in names or flag == "--engine"
        if not known or not rest:
            _usage(f"{flag} needs a value" if known else f"unexpected {flag!r}")
        if flag == "--engine":
            name, eq, module = rest.pop(0).partition("=")
            if not (name and eq and module):
                _usage("--engine takes NAME=MODULE")
            args.engines[name] = module
            continue
        setattr(args, names[flag], rest.pop(0))
    try:
        args.nnodes, args.gpus_per_node = int(args.nnodes), int(args.gpus_per_node)
    except ValueError:
        _usage("--nnodes and --gpus-per-node take whole numbers")
    if args.nnodes < 1 or args.gpus_per_node < 1:
        _usage("--nnodes and --gpus-per-node are required, each >= 1")
    return args


def _usage(why: str) -> None:
    print(f"{USAGE}\nincheck.py: error: {why}", file=sys.stderr)
    raise SystemExit(2)


def _environment(tmp: str) -> None:
    """Offline, and every cache in a scratch directory (the image may be read-only)."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      TOKENIZERS_PARALLELISM="false")
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tmp, "datasets"))
    os.environ.setdefault("HF_HOME", os.path.join(tmp, "hf"))
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")


def verdict(stages: list[dict[str, Any]]) -> str:
    return "rejected" if any(s["status"] == "fail" for s in stages) else "pass"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = sys.stdout
    tee = Tee(sys.stderr)
    start = time.monotonic()
    report: dict[str, Any] = {"schema": SCHEMA, "level": "config", "nnodes": args.nnodes,
                              "gpus_per_node": args.gpus_per_node,
                              "overrides": list(args.overrides)}
    with tempfile.TemporaryDirectory(prefix="verl-env-train-check-") as tmp, \
            contextlib.redirect_stdout(tee):
        _environment(tmp)
        os.makedirs(os.path.join(tmp, "rows"))
        check = Check(args, tee, os.path.join(tmp, "rows"))
        try:
            import verl

            report["verl"] = getattr(verl, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - nothing to check with
            report.update(status="error", error=f"verl is not importable here: {exc}",
                          stages=[])
        else:
            try:
                check.all()
                report.update(status=verdict(check.stages), stages=check.stages)
                if report["status"] == "pass":
                    check.run("gpu", check.stop)
                    check.stages[-1]["status"] = "stop"
            except Exception as exc:  # noqa: BLE001 - the checker itself broke
                traceback.print_exc(file=sys.stderr)
                report.update(status="error", error=f"the checker broke: {exc!r}",
                              stages=check.stages)
    report["seconds"] = round(time.monotonic() - start, 2)
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    out.write(text + "\n")
    out.flush()
    return EXIT[report["status"]]


if __name__ == "__main__":
    sys.exit(main())
