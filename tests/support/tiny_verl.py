"""A tiny verl training input made here, with no network: a model directory (a small Qwen2-style
config with random weights saved by transformers; a byte-level BPE tokenizer trained locally
with ``tokenizers``, saved as a Hugging Face tokenizer with a chat template) and a gsm8k-shaped
train/val parquet pair (the columns verl's examples/data_preprocess/gsm8k.py writes).

It needs torch, transformers, tokenizers and pyarrow: run it with a python that has verl's
dependencies (the host verl venv of tests/support/verl_hostenv.py, or an image's python), as a
script or imported:

    python tiny_verl.py --model DIR --data DIR [--train-rows N] [--val-rows N]

writes ``DIR/config.json``, weights and tokenizer files, and ``DATA/train.parquet``,
``DATA/test.parquet``; prints a JSON summary. Deterministic (fixed seeds). Importing it needs
nothing but the standard library: the heavy imports happen in the functions.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

DATA_SOURCE = "openai/gsm8k"
# verl's gsm8k preprocessing appends this to every question
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NAMES = ["Ann", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal"]
ITEMS = ["apples", "pens", "books", "coins", "shells", "cards"]


def problem(i: int, rng: random.Random) -> tuple[str, str, str]:
    """(question, worked solution ending in ``#### N``, N) of one small word problem."""
    a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(1, 9)
    who, item = NAMES[i % len(NAMES)], ITEMS[(i // len(NAMES)) % len(ITEMS)]
    total = (a + b) * c
    question = (f"{who} has {a} {item} and finds {b} more. Each of them is worth {c} points. "
                f"How many points are the {item} worth?")
    solution = (f"{who} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}. "
                f"They are worth {a + b} * {c} = <<{a + b}*{c}={total}>>{total} points.\n"
                f"#### {total}")
    return question, solution, str(total)


def rows(split: str, n: int, seed: int) -> list[dict[str, Any]]:
    """gsm8k-shaped rows, as verl's preprocessing writes them."""
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        question, solution, answer = problem(idx, rng)
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": idx, "answer": solution,
                           "question": question},
        })
    return out


def write_data(data: Path, *, train_rows: int = 64, val_rows: int = 16) -> dict[str, str]:
    """``data/train.parquet`` and ``data/test.parquet``; their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, name, n, seed in (("train", "train.parquet", train_rows, 1),
                                 ("test", "test.parquet", val_rows, 2)):
        path = data / name
        pq.write_table(pa.Table.from_pylist(rows(split, n, seed)), path)
        out[split] = str(path)
    return out


def corpus() -> list[str]:
    """Text the tokenizer learns from: the problems, their solutions and the chat frame."""
    rng = random.Random(0)
    texts = []
    for i in range(400):
        q, s, _ = problem(i, rng)
        texts += [f"user\n{q} {INSTRUCTION}", f"assistant\n{s}"]
    return texts + ["system user assistant 0123456789 + - * / = << >> ####"]


def write_tokenizer(model: Path, vocab_size: int) -> Any:
    """A byte-level BPE trained on :func:`corpus`, saved as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", unk_token=None,
                                 model_max_length=2048)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(model)
    return hf


def write_model(model: Path, *, vocab_size: int = 512, hidden: int = 64, layers: int = 2
                ) -> dict[str, Any]:
    """A Qwen2-style causal LM with random weights (seeded) and its tokenizer under ``model``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    model.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(model, vocab_size)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(config)
    lm.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id,
                                            pad_token_id=tok.pad_token_id)
    lm.save_pretrained(model)
    return {"path": str(model), "vocab_size": len(tok), "model_type": config.model_type,
            "parameters": sum(p.numel() for p in lm.parameters())}


def make(model: Path, data: Path, *, train_rows: int = 64, val_rows: int = 16
         ) -> dict[str, Any]:
    """The model directory and the parquet pair; a summary."""
    return {"model": write_model(model),
            "data": write_data(data, train_rows=train_rows, val_rows=val_rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="model directory to write")
    p.add_argument("--data", type=Path, required=True, help="data directory to write")
    p.add_argument("--train-rows", type=int, default=64)
    p.add_argument("--val-rows", type=int, default=16)
    args = p.parse_args(argv)
    print(json.dumps(make(args.model, args.data, train_rows=args.train_rows,
                          val_rows=args.val_rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
