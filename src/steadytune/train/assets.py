"""The embedded default: a tiny Llama model, a BPE tokenizer and an instruction set.

Everything is generated offline and cached, so ``steadytune demo`` and the tests
run with no hub and no download. The tasks are ones a tiny model visibly learns
in a couple of hundred steps: copying, upper-casing, reversing short words,
small sums and a handful of memorisable facts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ASSET_VERSION = "1"

_WORDS = (
    "apple river stone cloud green light music paper tiger window silver garden "
    "orange planet summer winter bread candle forest ocean rocket yellow violet "
    "pencil mirror castle dragon falcon meadow thunder harbor lantern"
).split()

_FACTS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Chile": "Santiago",
    "Canada": "Ottawa",
    "Greece": "Athens",
    "Cuba": "Havana",
}


def default_cache_dir() -> Path:
    """``$STEADYTUNE_CACHE`` or ``~/.cache/steadytune``."""
    env = os.environ.get("STEADYTUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "steadytune"


def demo_assets_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"demo-v{ASSET_VERSION}"


def _example(rng: random.Random) -> dict[str, str]:
    task = rng.randrange(5)
    if task == 0:
        w = " ".join(rng.sample(_WORDS, 2))
        return {"instruction": "Repeat the words.", "input": w, "output": w}
    if task == 1:
        w = " ".join(rng.sample(_WORDS, 2))
        return {"instruction": "Write the words in capitals.", "input": w, "output": w.upper()}
    if task == 2:
        w = rng.choice(_WORDS)
        return {"instruction": "Spell the word backwards.", "input": w, "output": w[::-1]}
    if task == 3:
        a, b = rng.randrange(10, 50), rng.randrange(10, 50)
        return {"instruction": "Add the numbers.", "input": f"{a} + {b}", "output": str(a + b)}
    country = rng.choice(sorted(_FACTS))
    return {"instruction": "Name the capital.", "input": country, "output": _FACTS[country]}


def generate_instructions(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` instruction/input/output rows, deterministic for a seed."""
    rng = random.Random(seed)
    return [_example(rng) for _ in range(n)]


def _wrong_answer(row: dict[str, str], rng: random.Random) -> str:
    """A plausible answer to ``row`` that is wrong in the way its task invites."""
    task, given, right = row["instruction"], row["input"], row["output"]
    if task == "Repeat the words.":
        return " ".join(reversed(given.split()))
    if task == "Write the words in capitals.":
        return given.capitalize()
    if task == "Spell the word backwards.":
        return given
    if task == "Add the numbers.":
        return str(int(right) + rng.choice((-10, -2, -1, 1, 2, 10)))
    return rng.choice(sorted(set(_FACTS.values()) - {right}))


def generate_preferences(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` preference rows for the demo tasks: instruction, input, the right answer as ``chosen``
    and a wrong one as ``rejected`` (for DPO, KTO, ORPO); deterministic for a seed."""
    rng = random.Random(seed)
    rows = []
    for row in generate_instructions(n, seed):
        chosen = row.pop("output")
        rows.append({**row, "chosen": chosen, "rejected": _wrong_answer({**row, "output": chosen}, rng)})
    return rows


def brevity_reward(completions: list[Any], **_: Any) -> list[float]:
    """A reward for GRPO on the demo prompts that a tiny model can earn: the shorter the completion,
    the higher (1 for an empty one, 0 from 64 characters). In TRL's reward function form: a plain
    string or a conversation per completion in, one float each out."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [1.0 - min(len(t), 64) / 64 for t in texts]


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def _render_for_tokenizer(row: dict[str, str]) -> str:
    return (
        f"### Instruction:\n{row['instruction']}\n### Input:\n{row['input']}\n### Response:\n{row['output']}"
    )


def build_tokenizer(texts: list[str], out_dir: Path, vocab_size: int = 512) -> None:
    """Train a byte-level BPE tokenizer and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    # A chat template lets the `messages` data format work on the demo model too.
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    fast.save_pretrained(out_dir)


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """transformers imports torchao where it is installed, and torchao's import logs warnings that
    read as errors on a machine without its kernels' CUDA build ("Failed to load ..._C_mxfp8...so")
    and torch's deprecation notes about the enums it registers. Building the demo model uses neither:
    a first ``make demo`` should not open on them."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def build_model(tokenizer_dir: Path, out_dir: Path, seed: int = 0) -> None:
    """A 2-layer Llama-architecture model from a config, saved with ``save_pretrained``."""
    import torch

    with _quiet_import():
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def ensure_demo_assets(cache_dir: Path | None = None, n_train: int = 2000, n_eval: int = 100) -> Path:
    """Build (once) and return the demo assets folder: ``model/``, ``train.jsonl``, ``eval.jsonl``.

    Built into a temporary folder and renamed in place, so an interrupted build
    never leaves a half-made asset that a later run would trust.
    """
    root = demo_assets_dir(cache_dir)
    done = root / "READY"
    if done.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.{os.getpid()}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    train = generate_instructions(n_train, seed=1)
    evals = generate_instructions(n_eval, seed=2)
    _write_jsonl(tmp / "train.jsonl", train)
    _write_jsonl(tmp / "eval.jsonl", evals)
    texts = [_render_for_tokenizer(r) for r in train]
    build_tokenizer(texts, tmp / "tokenizer")
    build_model(tmp / "tokenizer", tmp / "model")
    digest = hashlib.sha256((tmp / "train.jsonl").read_bytes()).hexdigest()[:16]
    (tmp / "READY").write_text(json.dumps({"version": ASSET_VERSION, "train_sha256": digest}))
    try:
        os.replace(tmp, root)
    except OSError:
        # Another process won the race; its copy is as good as ours.
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return root
