"""Issue 39 item 3: values in hydra's override grammar (builder/train/overrides.py), held to hydra's
own parser where hydra-core is installed (skipped, with the reason, where it is not)."""

from __future__ import annotations

import random
import re

import pytest

from builder.train import overrides as hydra
from builder.train.shapes import TrainShapeError, default_command, parse_override

PATHS = {"model": "/m/q", "train_files": "/data/my data,v2/train.parquet",
         "val_files": "/data/it's=1/test.parquet"}
SAMPLES = ["a b", " a ", "x~y", "x#y", "x;y", "x'y", 'x"y', "{a:1}", "[a,b]", "[a b,c]", "a:b",
           "x(y)", "$x", "${x}", "${x", "a\\,b", "", "'a b'c", "é", "a*b", "a|b", "1e-6",
           "[]", "[a,[b]]", "a[0]", "['a,b',c]", "'it\\'s'", "a,b", "[a", "a]", "range(1,3)",
           "/data/my data,v2/train.parquet", "[console,wandb]", "'a'", "a=b", "[a,]", "[] "]


def _parser():
    pytest.importorskip("hydra", reason="hydra-core is not installed here (verl's images "
                        "carry it; `pip install hydra-core` to run this check)")
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _hydra_takes(parser, value: str) -> bool:
    try:
        return not parser.parse_overrides([f"k={value}"])[0].is_sweep_override()
    except Exception:  # noqa: BLE001 - hydra's parse errors
        return False


def test_quote_round_trips_through_hydras_parser() -> None:
    parser = _parser()
    rng = random.Random(39)
    alphabet = "ab /,='\"\\[]{}$é:-\t.()~#"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        word = hydra.quote(text)
        value = parser.parse_overrides([f"k={word}"])[0].value()
        assert value == text or (word == text and str(value) == text), (text, word, value)
        assert hydra.unquote(word) == text


@pytest.mark.parametrize("value", SAMPLES)
def test_problem_agrees_with_hydra(value: str) -> None:
    assert (hydra.problem(value) is None) == _hydra_takes(_parser(), value), hydra.problem(value)


def test_problem_agrees_with_hydra_on_random_values() -> None:
    parser = _parser()
    rng = random.Random(2)
    for _ in range(3000):
        value = "".join(rng.choice("ab ,='\"\\[]x/") for _ in range(rng.randint(0, 6)))
        assert (hydra.problem(value) is None) == _hydra_takes(parser, value), value


def test_default_command_paths_parse_as_the_paths() -> None:
    """`--data "/data/my data,v2"`: every word of the default command is one override hydra
    reads, the paths as given (not a sweep, not an error)."""
    parser = _parser()
    argv = default_command("0.9.1", rollout="vllm", nnodes=1, gpus_per_node=8,
                           checkpoint_dir="${SLURM_SUBMIT_DIR}/my ckpt", **PATHS)
    parsed = {o.key_or_group: o for o in parser.parse_overrides(argv[3:])}
    assert not any(o.is_sweep_override() for o in parsed.values())
    assert parsed["data.train_files"].value() == PATHS["train_files"]
    assert parsed["data.val_files"].value() == PATHS["val_files"]
    assert parsed["trainer.default_local_dir"].value() == "${SLURM_SUBMIT_DIR}/my ckpt"
    assert parsed["trainer.resume_mode"].value() == "auto"


def test_default_command_quotes_what_needs_it() -> None:
    """Pure (no hydra): the words themselves."""
    argv = default_command("0.9.1", rollout="vllm", nnodes=1, gpus_per_node=8,
                           checkpoint_dir="/ckpt", **PATHS)
    assert "data.train_files='/data/my data,v2/train.parquet'" in argv
    assert "data.val_files='/data/it\\'s=1/test.parquet'" in argv
    assert "actor_rollout_ref.model.path=/m/q" in argv  # nothing to quote
    assert argv[-2:] == ["trainer.default_local_dir=/ckpt", "trainer.resume_mode=auto"]


@pytest.mark.parametrize("text, why", [
    ("data.train_files=/a b,c", "a comma outside quotes"),
    ("trainer.experiment_name=it's", "an unterminated ' quote"),
    ("a.b=x=y", "an '=' outside quotes"),
    ("a.b=[x,y", "an unclosed bracket")])
def test_user_overrides_hydra_refuses_are_refused_naming_the_option(text: str, why: str) -> None:
    with pytest.raises(TrainShapeError, match=re.escape(f"--override {text!r}: ") + ".*" +
                       re.escape(why)) as err:
        parse_override(text)
    assert "quote it: --override" in str(err.value)


def test_user_overrides_hydra_takes_pass() -> None:
    for text in ("trainer.logger=[console,wandb]", "data.train_files='/a b,c'", "+x.y=1",
                 "~trainer.logger", "a.b="):
        assert parse_override(text)[1] == text
