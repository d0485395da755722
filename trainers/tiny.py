"""The tiny embedded default models: a byte-level BPE tokenizer trained on the env texts (ChatML special tokens and
template) and a randomly initialised Qwen2 sized to it, saved as a Hugging Face folder any back end loads."""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from trainers.backends.common import end_token_ids

# ChatML, as Qwen2 uses it: "<|im_start|>role\ncontent<|im_end|>\n" per message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")

# Qwen2's pre-tokenisation pattern (what transformers applies when it loads a Qwen2 folder's tokenizer).
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, min_frequency: int = 2, model_max_length: int = 4096) -> Any:
    """A byte-level BPE tokenizer trained on `texts`, with ChatML special tokens and template.

    Special tokens: <|endoftext|>, <|im_start|>, <|im_end|> (the EOS: it ends every assistant
    turn) and <|pad|> (a pad distinct from EOS, so masks never confuse the two). Byte-level means
    any text encodes, including characters never seen in training.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # The folder is saved as a Qwen2 model, and transformers loads a Qwen2 folder's tokenizer with
    # Qwen2's own normaliser and pre-tokeniser whatever tokenizer.json says. Train with exactly those,
    # so the tokenizer a run loads splits text as the one the warm start trained with. (With GPT-2's
    # ByteLevel regex, " 4" was one token in training and " ", "4" after loading: every number an
    # actor read, ALFWorld's "drawer 3" or an entry's "2 south", was a sequence it had never seen.)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=model_max_length,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_qwen2(
    tokenizer: Any,
    hidden: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    mlp: int | None = None,
    max_pos: int = 4096,
    *,
    seed: int = 0,
) -> Any:
    """A randomly initialised Qwen2 causal LM sized to `tokenizer`, tied embeddings (a few M params).

    `mlp` defaults to 4 × hidden. Initialisation uses its own RNG seeded by `seed` (the global RNG
    is left alone), so the same arguments give the same model.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})")
    end_ids = sorted(end_token_ids(tokenizer))
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = end_ids
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_model_folder(model: Any, tokenizer: Any, path: str | os.PathLike) -> Path:
    """save_pretrained both into one folder: what `load_backend("hf", path)` reads."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "comprl_model.json").write_text(json.dumps({"built_by": "comprl", "params": sum(p.numel() for p in model.parameters())}))
    return out
