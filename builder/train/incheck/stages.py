"""The stages of one check, in order: what ``verl.trainer.main_ppo`` does before the first GPU
is needed (the list is in :mod:`.main`'s docstring)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import time
import traceback
from typing import Any, Callable

from .args import Args
from .rules import Rejected, fit_fix, fix_for, root_message, round_up

PASSED = "All configuration checks passed"


class Tee(io.TextIOBase):
    """stderr that also keeps what was written (verl prints its verdicts)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.kept = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()



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
                           fix=f"data.max_prompt_length={round_up(length or limit + 1, 64)}")
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
                           fix=fit_fix(cfg, rows))
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

