"""The embedded default models: build a tiny policy and a tiny extractor and warm-start both.

    paths = ensure_models("~/.comprl")          # {"policy": .../models/policy, "extractor": .../models/extractor}

One pipeline, top to bottom (`build._build`):
  1. collect scripted-expert episodes from the envs: no entry (~40%), a correct entry whose advice
     the expert follows (~45%), a wrong or irrelevant entry that the expert ignores (~15%); some
     episodes are played by an epsilon-noisy expert (random moves, invalid words) whose states are
     labelled with the expert's action, so the demonstrations show recovering from mistakes;
  2. train a byte-level BPE tokenizer on that text (prompts, actions, extractor answers);
  3. build two Qwen2 models of a few million parameters;
  4. SFT the policy on (actor prompt -> expert action); part-way, roll out the partly trained
     policy and relabel its own states with the expert (DAgger), then continue on the union;
  5. SFT the extractor on well-formed `<think>…</think><answer>[ops]</answer>` answers written by a
     rule-based teacher from expert and noisy trajectories, plus search-and-ask rewrites and merges;
  6. measure (greedy success and mean actions on held-out seeds with no / a correct / a wrong entry;
     the share of extractor answers that parse) and save both folders with a `warmstart.json`.

Every prompt comes from trainers/prompts.py, exactly as rollouts build them (FIELD-NOTES: a model
is only as good as the match between its training prompts and the prompts it is run on).
Folders are built in a temporary directory and renamed into place, so an interrupted build never
leaves a half model; a `warmstart.json` marker with the config hash makes `ensure_models` idempotent.

The package, by job: `common` (the settings and the records passed between stages), `teachers` (the scripted
teachers and their demonstrations), `examples` (demonstrations into SFT rows for both models), `sft` (the SFT loop,
the build's rollouts and checks), `build` (the pipeline, the extractor's process, `ensure_models`, `comprl models`).
Every name the single module had that is used elsewhere is importable from here.
"""
from __future__ import annotations

from trainers.parsing import parse_extractor_answer  # noqa: F401  (the warm start's parse rate uses the one parser)
from trainers.warmstart.common import (  # noqa: F401
    _INVALID_WORDS,
    ACTION_LEAD,
    Demo,
    FORMAT_VERSION,
    IGNORE,
    MARKER,
    SFTExample,
    Turn,
    WarmStartConfig,
)
from trainers.warmstart.teachers import (  # noqa: F401
    _alfworld_action,
    _claimed,
    _eval_seed,
    _make_env,
    _Teacher,
    collect_demos,
    play_episodes,
    TeacherEnv,
)
from trainers.warmstart.examples import (  # noqa: F401
    _actor_prompt,
    _chat_ids,
    _copyable,
    _debrief,
    _debrief_quote,
    _extractor_prompt,
    _extractor_target,
    _join,
    _lesson,
    _merge_chunk,
    _merge_key,
    _short_prompt,
    extractor_examples,
    policy_examples,
)
from trainers.warmstart.sft import (  # noqa: F401
    _evaluate_extractor,
    _rollouts,
    _sft,
    action_token_budget,
)
from trainers.warmstart.build import (  # noqa: F401
    _train_extractor,
    demo_tokenizer,
    ensure_models,
    models_command,
    read_marker,
    train_extractor,
)

__all__ = [
    "WarmStartConfig",
    "ensure_models",
    "models_command",
    "Demo",
    "SFTExample",
    "collect_demos",
    "policy_examples",
    "extractor_examples",
    "parse_extractor_answer",
    "MARKER",
    "FORMAT_VERSION",
]
