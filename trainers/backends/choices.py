"""Constrained replies (admissible actions): what a reply may be (`ActionChoice`) and how a decoding row keeps to it
token by token (`ChoiceVocab`, `ChoiceState`). Plain Python, no torch: the hf back end masks its logits with it, vLLM
and llama.cpp get the same set as a regex or a GBNF grammar, and rollouts build choices without loading a model."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PLACEHOLDER = re.compile(r"<[A-Za-z_][A-Za-z0-9_ -]*>")  # "search[<query>]": the part from here on is free text


@dataclass(frozen=True)
class ActionChoice:
    """What a constrained reply may be ("guided choice"): exactly one of `actions`, then an end token; or one of
    `open_prefixes` followed by free text (a search-and-ask call "<search_and_ask>…", WebShop's "search[<query>]",
    whose query no list can hold). Every back end reads it at the character level: any tokenization of an allowed
    string is allowed, as vLLM's structured outputs and llama.cpp's grammars do.

        ActionChoice.of(["go to fridge 1", "look", "search[<query>]"])
        -> actions ("go to fridge 1", "look"), open_prefixes ("search[",)
    """

    actions: tuple[str, ...]
    open_prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, admissible: Sequence[str], open_prefixes: Sequence[str] = ()) -> "ActionChoice":
        """An env's admissible-action list: an entry with a <placeholder> becomes an open prefix (the text before it)."""
        acts: list[str] = []
        opens: list[str] = [p for p in open_prefixes if p]
        for a in admissible:
            a = str(a)
            m = PLACEHOLDER.search(a)
            if m:
                if a[: m.start()]:
                    opens.append(a[: m.start()])
            elif a.strip():
                acts.append(a)
        return cls(tuple(dict.fromkeys(acts)), tuple(dict.fromkeys(opens)))

    def __bool__(self) -> bool:
        return bool(self.actions or self.open_prefixes)

    def gbnf(self) -> str:
        """A GBNF grammar (llama.cpp's `grammar` field) whose sentences are exactly the allowed replies."""
        alts = [_gbnf_literal(a) for a in self.actions] + [f'{_gbnf_literal(p)} [^\\n]*' for p in self.open_prefixes]
        return "root ::= " + " | ".join(alts) + "\n"

    def regex(self) -> str:
        """The same set as a regular expression (vLLM's structured outputs when an open prefix needs one)."""
        alts = [_regex_literal(a) for a in self.actions] + [_regex_literal(p) + r"[^\n]*" for p in self.open_prefixes]
        return "(" + "|".join(alts) + ")"


def _regex_literal(s: str) -> str:
    # only the metacharacters (re.escape also escapes spaces, which some grammar compilers' regex readers refuse)
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", s).replace("\n", "\\n")


def _gbnf_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def as_choice(c: ActionChoice | Sequence[str] | None) -> ActionChoice | None:
    """None (free), an ActionChoice, or a plain list of admissible actions (read by ActionChoice.of)."""
    if c is None or isinstance(c, ActionChoice):
        return c or None
    if isinstance(c, str):
        raise TypeError("a choice is a list of actions, not one string")
    return ActionChoice.of(c) or None


class ChoiceVocab:
    """A tokenizer's vocabulary as text, for masking: `by_text` maps a token's text (as it reads inside a reply,
    leading space kept) to its ids. Special tokens, empty pieces and pieces that are part of a UTF-8 character are
    left out (a reply may still end in an end token, which the constraint adds itself)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        n = min(vocab_size, len(tokenizer))
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        # Decoded after an anchor token so that tokenizers which drop a piece's leading space when it starts the
        # text (sentencepiece's "▁to") give " to"; byte-level BPE gives the same with or without the anchor.
        anchor = tokenizer("a", add_special_tokens=False)["input_ids"][:1]
        head = tokenizer.decode(anchor) if anchor else ""
        texts = tokenizer.batch_decode([anchor + [i] for i in range(n)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        self.by_text: dict[str, list[int]] = {}
        self.piece: dict[int, str] = {}
        for i, t in enumerate(texts):
            if i in special or not t.startswith(head):
                continue
            piece = t[len(head):]
            if piece and "\ufffd" not in piece:
                self.by_text.setdefault(piece, []).append(i)
                self.piece[i] = piece
        self.longest = max((len(k) for k in self.by_text), default=1)
        self._ntok: dict[str, int] = {"": 0}

    def tokens_for(self, s: str) -> int:
        """Tokens the tokenizer spends on `s` (a bound on the fewest a reply needs to write it)."""
        n = self._ntok.get(s)
        if n is None:
            n = self._ntok[s] = len(self.tokenizer(s, add_special_tokens=False)["input_ids"])
            if len(self._ntok) > 200_000:
                self._ntok = {"": 0}
        return n


class ChoiceState:
    """One row's progress through an ActionChoice while it decodes: the reply's text so far, which token ids may
    come next, and when the reply has reached an open prefix (free from then on)."""

    def __init__(self, choice: ActionChoice, vocab: ChoiceVocab, end_ids: Iterable[int]) -> None:
        self.choice, self.vocab, self.end_ids = choice, vocab, sorted(end_ids)
        self.text = ""
        self.free = False

    def allowed(self, budget: int) -> list[int] | None:
        """Token ids that keep the reply on an allowed string, with `budget` tokens left for the reply (this one
        included). A token of a string is offered while the rest of that string still fits after it, with room for
        the end token where the string and its end fit the budget at all (a tokenizer's own spelling of the rest
        bounds what it needs); when no token fits, every token that stays on a string, so a reply too long for its
        budget is cut as a prefix of one rather than wander off. None: no constraint (free)."""
        if self.free:
            return None
        g = self.text
        fits: set[int] = set()
        rest_any: set[int] = set()
        for a in self.choice.actions:
            if a.startswith(g):
                self._extend(a[len(g):], budget, 1, fits, rest_any)
        for p in self.choice.open_prefixes:
            if p.startswith(g):
                self._extend(p[len(g):], budget, 0, fits, rest_any)
        if g in self.choice.actions:  # a complete action: it may end here
            fits.update(self.end_ids)
        out = fits or rest_any
        if not out:  # off every allowed string (only after an unconstrained token): free from here
            self.free = True
            return None
        return sorted(out)

    def _extend(self, rest: str, budget: int, end: int, fits: set[int], rest_any: set[int]) -> None:
        if not rest:
            return
        if self.vocab.tokens_for(rest) + end > budget:
            end = 0  # the string fits only without its end token: the reply may stop at the budget, complete
        for k in range(1, min(len(rest), self.vocab.longest) + 1):
            ids = self.vocab.by_text.get(rest[:k])
            if ids:
                (fits if 1 + self.vocab.tokens_for(rest[k:]) + end <= budget else rest_any).update(ids)

    def advance(self, token_id: int) -> None:
        if self.free or token_id in self.end_ids:
            return
        piece = self.vocab.piece.get(token_id)
        if piece is None:  # not a token allowed() offers: the reply has left the choice, nothing more to constrain
            self.free = True
            return
        self.text += piece
        if any(self.text.startswith(p) for p in self.choice.open_prefixes):
            self.free = True

