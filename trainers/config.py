"""Run configuration: one dataclass per component (DESIGN.md habit 2), YAML overriding fields.

    cfg = load_run_config("configs/minihack_room_cpu.yaml")     # or a YAML string, or a dict

Defaults run on a 2-core CPU with the embedded tiny models. A bad field stops before any work
with a ConfigError that names it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.config import ConfigError, LibraryConfig, from_dict, load_yaml, safe_load_yaml, to_dict
from trainers.parsing import OP_BUDGET

VARIANTS = ("grpo", "static", "exp_only", "complementary")
EMBEDDED_PREFIX = "embedded:"


@dataclass(frozen=True)
class PromptDefaults:
    """The prompt shape the embedded models are built with and a run shows them by default: the run's sections below
    and the build's WarmStartConfig (trainers/warmstart/common.py) read these fields' defaults from PROMPT_DEFAULTS,
    so a new default shape is one change here. Either config may still set its own value; a run that uses the
    embedded models with another one is told where (`embedded_build_mismatches`)."""

    # Earlier (observation, action) pairs in the actor's prompt. 0: on the dark room the reader needs the task, the
    # observation and the entry, and each history item (a whole observation, ~150 tokens) made a step of SFT and of
    # the run's rollouts and learner ~2x longer.
    history_turns: int = 0
    history_chars: int = 1200  # the history's character budget
    search_and_ask: int = 0  # search-and-ask calls per episode (0 = off); above 0 the actor's system text offers it
    trajectory_chars: int = 1500  # the trajectory's length in the extractor's prompt
    op_budget: int = OP_BUDGET  # operations per distillation answer, shown in the extractor's prompt (the release's 3)


PROMPT_DEFAULTS = PromptDefaults()


@dataclass
class RunSection:
    name: str = "run"  # shown in the workbench's run table
    variant: str = "complementary"  # grpo | static | exp_only | complementary (docs/method.md "The four variants")
    seed: int = 0  # the one seed; per-sample seeds derive from (step, index)
    max_steps: int = 100  # actor updates (training steps) before the run finishes
    warmup_steps: int = 0  # first steps: retrieval off, actor not updated, the library is seeded (released: 5)
    checkpoint_every: int = 10  # steps between checkpoints (and one at stop)
    eval_every: int = 0  # steps between held-out evaluations (0 = only at the end)
    eval_episodes: int = 16  # held-out episodes per evaluation, per condition (with / without experience)
    eval_sampled: bool = True  # also evaluate at the rollout temperature (eval/success_*_sampled): GRPO trains the sampler
    eval_at_start: bool = False  # evaluate the starting policy before the first step (a fresh run only)
    store_episodes: bool = True  # keep every episode in the store (replay in the workbench; entry lineage points at them)
    deterministic: bool = False  # True: collect then learn, distillation waited for (reproducible, for tests); False: the next
    # step's rollouts overlap this step's learning (staleness one policy version) and distillation runs behind
    threads: int = 0  # torch CPU threads (0 = torch's default)
    # local: env workers are processes of this machine and the ExperienceManager lives in the trainer. ray: env
    # workers are Ray actors and the manager one async Ray actor (trainers/ray_exec.py; the `ray` section says where)
    executor: str = "local"

    def __post_init__(self) -> None:
        if self.executor not in ("local", "ray"):
            raise ConfigError(f"run.executor must be local or ray, not {self.executor!r}")
        if self.variant not in VARIANTS:
            raise ConfigError(f"run.variant must be one of {', '.join(VARIANTS)}, not {self.variant!r}")
        if self.max_steps < 1:
            raise ConfigError("run.max_steps must be >= 1")
        if self.warmup_steps < 0 or self.checkpoint_every < 1 or self.eval_episodes < 0:
            raise ConfigError("run.warmup_steps and eval_episodes must be >= 0, checkpoint_every >= 1")
        if self.eval_every < 0:
            raise ConfigError(f"run.eval_every must be >= 0 (0: only at the end), not {self.eval_every}")


@dataclass
class EnvSection:
    names: dict[str, float] = field(default_factory=lambda: {"minihack/Room-5x5": 1.0})  # env name -> mixture weight
    max_turns: int = 0  # turn limit per episode (0 = the env's own)
    train_seeds: int = 100_000  # task seeds for training are drawn from [0, train_seeds)
    eval_seed_offset: int = 1_000_000  # held-out seeds start here (never seen in training)
    # > 0: a finite set of recurring training tasks per env, ids 0..task_set-1, each one fixed instance (its seed a
    # hash of env and id) whose id is in the task text the actor sees and retrieval is keyed by ("Dungeon 17: ...").
    # Evaluation then reports seen tasks (eval/success_*) and unseen ids task_set.. (eval/unseen_success_*).
    # 0: every episode a fresh random seed from [0, train_seeds) (the task text names no instance).
    task_set: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # passed to make_env for every env

    def __post_init__(self) -> None:
        if not self.names:
            raise ConfigError("env.names must name at least one env, e.g. {minihack/Room-5x5: 1.0}")
        from envs.registry import ENVS, list_envs

        unknown = [n for n in self.names if n not in ENVS]
        if unknown:  # else the run starts and every episode "fails" in its worker
            raise ConfigError(f"env.names: unknown env {unknown[0]!r}; known envs: {', '.join(list_envs())}")
        if self.max_turns < 0:
            raise ConfigError(f"env.max_turns must be >= 0 (0 = the env's own limit), not {self.max_turns}")
        if self.task_set < 0:
            raise ConfigError("env.task_set must be >= 0 (0 = a random seed every episode)")
        for n, w in self.names.items():
            if not isinstance(w, (int, float)) or w <= 0:
                raise ConfigError(f"env.names[{n!r}] must be a positive weight")


@dataclass
class ModelSection:
    path: str = "embedded:policy"  # a Hugging Face model folder, or embedded:policy / embedded:extractor / embedded:extractor-weak
    # auto | hf | vllm | openai. openai: an OpenAI-compatible server (vLLM's, llama.cpp's, a hosted one) at base_url,
    # for inference roles only (a frozen actor or extractor, evaluation, A/B tests, the demo); `path` is then a local
    # folder with the served model's tokenizer and chat template (the prompts are built here, sent as text)
    backend: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    base_url: str = ""  # backend openai: the endpoint, e.g. http://127.0.0.1:8000/v1
    served_model: str = ""  # backend openai: the model name the endpoint serves (default: the folder's name)
    timeout_s: float = 60.0  # backend openai: seconds per request before it is retried
    max_retries: int = 3  # backend openai: retries of a failed request (connection, timeout, 429, 5xx), with backoff
    lr: float = 2e-5  # AdamW learning rate (constant after the warm-up)
    # Linear learning-rate warm-up over the first N optimiser steps. Adam's first step moves every weight
    # by the full lr: measured on the embedded policy, one step at 3e-4 took the KL to the sampling policy to 1.7.
    lr_warmup: int = 0
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    micro_batch: int = 32  # rows per forward/backward (gradient accumulation keeps memory bounded)
    temperature: float = 1.0  # sampling temperature for rollouts
    top_p: float = 1.0  # nucleus sampling for rollouts
    max_new_tokens: int = 16  # tokens per reply
    lora: bool = False  # train LoRA adapters (peft) instead of all weights
    # the learner's forward under bf16 autocast on a CPU (trainers/actor_step.py): faster where the CPU has bf16 units
    # (measured on SmolLM2's step, benchmarks/results/bench_bf16_learner.md); the PPO ratio then carries bf16 rounding
    cpu_bf16_autocast: bool = False

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "hf", "vllm", "openai"):
            raise ConfigError(f"backend must be auto, hf, vllm or openai, not {self.backend!r}")
        if self.lr <= 0 or self.micro_batch < 1 or self.max_new_tokens < 1 or self.lr_warmup < 0:
            raise ConfigError("lr must be > 0, micro_batch and max_new_tokens >= 1, lr_warmup >= 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError("top_p must be within (0, 1]")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, not {self.temperature}")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError("backend openai needs base_url, the endpoint (e.g. http://127.0.0.1:8000/v1)")
        if self.base_url and self.backend != "openai":
            raise ConfigError(f"base_url belongs to backend openai (this section's backend is {self.backend}); remove it or set backend: openai")
        if self.timeout_s <= 0 or self.max_retries < 0:
            raise ConfigError("timeout_s must be > 0 and max_retries >= 0")


@dataclass
class RolloutSection:
    tasks_per_step: int = 4  # distinct tasks (groups) per training step
    group_size: int = 8  # K rollouts per task
    # Of the K, how many get retrieved experience (0 = plain GRPO). Unset: K/2 (the paper) for the experience
    # variants, 0 for variant grpo; grpo with a value > 0 is refused, never silently changed.
    with_experience: int | None = None
    history_turns: int = PROMPT_DEFAULTS.history_turns  # past (observation, action) pairs in the prompt
    history_chars: int = PROMPT_DEFAULTS.history_chars  # and at most this many characters of them
    search_and_ask: int = PROMPT_DEFAULTS.search_and_ask  # max search-and-ask calls per episode (paper: 2; 0 = tool off)
    actor_critic: bool = False  # the actor judges each retrieved entry first: accept 1 / refine 0.5 / reject 0 (hidden); entry reward = score + outcome
    # compact: the tiny embedded models' one-message prompt (what they were warm-started on); chat: for a pretrained
    # chat model (rules, admissible actions, an example exchange, the episode as a multi-turn conversation; trainers/prompts.py)
    prompt_style: str = "compact"
    # keep each episode's KV cache across its turns (hf back end, prompt_style chat, whose prompts extend turn to turn):
    # a turn prefills only what the last prompt lacked. Not used with compact prompts (they share only the system text
    # and task, already run once per batch; benchmarks/results/bench_training_sessions_tiny.md).
    reuse_cache: bool = True
    # decode each reply constrained to the env's admissible actions ("guided choice": a logits mask on the hf back end,
    # structured outputs on vLLM, a GBNF grammar on a llama.cpp server), on envs whose list is complete (MiniHack,
    # ALFWorld, WebShop with its search query left free; never SWE, whose list names only some commands); a
    # search-and-ask call stays possible while its budget lasts. Off: free replies, read by the tolerant parser.
    constrain_actions: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.constrain_actions, bool):
            raise ConfigError(f"rollout.constrain_actions must be true or false, not {self.constrain_actions!r}")
        if self.prompt_style not in ("compact", "chat"):
            raise ConfigError(f"rollout.prompt_style must be compact or chat, not {self.prompt_style!r}")
        if self.tasks_per_step < 1 or self.group_size < 1:
            raise ConfigError("rollout.tasks_per_step and rollout.group_size must be >= 1")
        if self.with_experience is not None and not 0 <= self.with_experience <= self.group_size:
            raise ConfigError("rollout.with_experience must be within [0, rollout.group_size]")


@dataclass
class LossSection:
    eps: float = 0.2  # PPO clip range
    ratio_level: str = "sequence"  # sequence (paper) | token (released code)
    normalize_std: bool = True  # divide advantages by the subgroup std (paper) or only subtract the mean (released)
    joint_normalization: bool = False  # ablation: normalise across both subgroups together (collapses, per the paper)
    epochs: int = 1  # passes over each batch
    # token: the surrogate is a mean over every reply token of the subgroup (docs/method.md); a failed
    # episode that runs to the turn limit then outweighs a quick success several times over.
    # episode: each episode weighs the same in its subgroup (its own turns' token mean).
    aggregation: str = "token"
    # env: the env's summed reward (MiniHack adds -0.01 per turn that does not advance time, so in a
    # group where every episode failed, std normalisation turns wall bumps into full-size advantages);
    # outcome: +1 success / -1 failure, the task outcome docs/method.md names.
    reward: str = "env"

    def __post_init__(self) -> None:
        if self.ratio_level not in ("sequence", "token"):
            raise ConfigError("loss.ratio_level must be 'sequence' or 'token'")
        if self.reward not in ("env", "outcome"):
            raise ConfigError("loss.reward must be 'env' or 'outcome'")
        if self.aggregation not in ("token", "episode"):
            raise ConfigError("loss.aggregation must be 'token' or 'episode'")


@dataclass
class ExtractorSection:
    model: ModelSection = field(default_factory=lambda: ModelSection(path="embedded:extractor", lr=1e-5, max_new_tokens=320,
                                                                      temperature=0.8))
    trajectory_chars: int = PROMPT_DEFAULTS.trajectory_chars  # the trajectory's length in the extractor's prompt
    buffer_size: int = 64  # CISPO update when this many entry samples are waiting
    eps_low: float = 0.1  # CISPO clip, lower
    eps_high: float = 0.1  # CISPO clip, upper
    # beta of a KL penalty to the extractor's start (the model extractor.model.path names, frozen): each reply token adds
    # beta * KL(pi || pi_ref) of its prediction, exact over the vocabulary (row_logprobs_kl), to the CISPO loss, averaged
    # over the batch's reply tokens as that loss is. 0 = none (docs/method.md's objective has none). With a reward of -1
    # for most samples a bare CISPO step moves mass onto other answer forms (the tiny extractor's merge answers) and its
    # sampled answers can stop parsing; measured on the known-reward test (lr 4e-4, 20 updates): beta 0.3 kept greedy
    # answers 0.97 parsable, beta 0.1 on the sampled token alone (k3) let every sample of one update fail to parse.
    kl_coef: float = 0.0
    reweight: bool = True  # Eq. 7 training-count-aware weights
    alpha: float = 0.5  # Eq. 7 exponent
    cooldown: int = 1  # Eq. 7 cooldown in extractor updates
    relative_reward: bool = False  # ablation: reward = improvement over the experience-free mean
    # What an entry's generation is rewarded with when the entry is retrieved: "step", the mean signed outcome of this
    # step's episodes that retrieved it (about 2 of them in the CPU default: a noisy reward); "lifetime", the mean
    # signed outcome of every episode that has retrieved it so far (the store's successes and failures), the same
    # quantity averaged over every retrieval (a denser signal for a short run). Not with relative_reward or critic.
    credit: str = "step"
    op_budget: int = PROMPT_DEFAULTS.op_budget  # operations per distillation answer (the release's 3)
    merge_every: int = 5  # actor updates between periodic merges (0 = never)
    max_backlog: int = 256  # episodes waiting for distillation beyond this are dropped (counted in extractor/dropped)
    templates_file: str = ""  # YAML overriding prompt templates (trainers/prompts.py names)
    # The extractor probe (trainers/probe.py): a fixed held-out set of `probe_size` finished trajectories on the seen
    # recurring tasks, distilled greedily every `probe_every` steps and at a run's start and end, its entries checked
    # (extractor/probe_*). 0 = no probe (the default; the shipped MiniHack configs turn it on). Runs only where an env
    # has an entry checker and env.task_set is set.
    probe_every: int = 0
    probe_size: int = 64

    def __post_init__(self) -> None:
        if self.buffer_size < 1 or self.op_budget < 1:
            raise ConfigError("extractor.buffer_size and extractor.op_budget must be >= 1")
        if not self.kl_coef >= 0:
            raise ConfigError(f"extractor.kl_coef must be >= 0 (0 = no KL penalty), not {self.kl_coef}")
        if self.credit not in ("step", "lifetime"):
            raise ConfigError(f"extractor.credit must be 'step' or 'lifetime', not {self.credit!r}")
        if self.probe_every < 0 or self.probe_size < 1:
            raise ConfigError("extractor.probe_every must be >= 0 (0 = no probe) and extractor.probe_size >= 1")
        if self.templates_file:
            # Read now, not when the extractor first needs it: a missing file would fail the run after it started.
            from trainers.prompts import load_templates

            try:
                load_templates(self.templates_file)
            except (OSError, ValueError, yaml.YAMLError) as e:
                raise ConfigError(f"extractor.templates_file: {' '.join(str(e).split())}") from None


@dataclass
class RaySection:
    """Where and how a run with run.executor ray places its actors (docs/scaling.md, "Past one machine: Ray")."""

    address: str = ""  # "" = start a local cluster inside the trainer; "auto" or host:port = join a running cluster (`ray start --head`)
    num_cpus: int = 0  # a local cluster's CPUs (0 = Ray's count of this machine's cores); ignored when joining a cluster
    env_actors: int = 0  # env-worker actors, each holding a share of the slots (0 = run.threads or 2, as the local pool)
    env_actor_cpus: float = 0.5  # CPUs Ray reserves per env actor (fractions pack several on one core)
    manager_cpus: float = 0.5  # CPUs Ray reserves for the ExperienceManager actor
    step_timeout_s: float = 30.0  # an env actor silent this long on a step is killed and restarted; its episodes fail
    call_timeout_s: float = 120.0  # a manager call unanswered this long: the actor is taken as hung, restarted, the call retried
    restart_timeout_s: float = 300.0  # how long a manager call keeps retrying while Ray restarts a dead manager actor
    # the rollout engine (the hf back end) as a Ray actor, its weights synced from the learner through the object store
    # after every update; False: it stays in the driver
    rollout_engine: bool = False
    engine_cpus: float = 0.5  # CPUs Ray reserves for the rollout engine actor

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.env_actors < 0:
            raise ConfigError("ray.num_cpus and ray.env_actors must be >= 0 (0 = the default)")
        if self.env_actor_cpus < 0 or self.manager_cpus < 0 or self.engine_cpus < 0:
            raise ConfigError("ray.env_actor_cpus, ray.manager_cpus and ray.engine_cpus must be >= 0")
        if self.step_timeout_s <= 0 or self.call_timeout_s <= 0 or self.restart_timeout_s <= 0:
            raise ConfigError("ray.step_timeout_s, ray.call_timeout_s and ray.restart_timeout_s must be > 0")


@dataclass
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    env: EnvSection = field(default_factory=EnvSection)
    actor: ModelSection = field(default_factory=ModelSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    loss: LossSection = field(default_factory=LossSection)
    extractor: ExtractorSection = field(default_factory=ExtractorSection)
    library: LibraryConfig = field(default_factory=LibraryConfig)
    ray: RaySection = field(default_factory=RaySection)

    def __post_init__(self) -> None:
        if self.run.executor == "ray":
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise ConfigError("run.executor ray needs Ray: pip install -e '.[ray]' (or set run.executor: local)")
        if self.ray.rollout_engine and (self.run.executor != "ray" or self.actor.backend not in ("auto", "hf", "vllm")):
            raise ConfigError("ray.rollout_engine puts the rollout engine (hf or vllm) in a Ray actor: it needs run.executor "
                              f"ray and actor.backend hf, vllm or auto (not {self.actor.backend})")
        # A config never silently means something else: what would be ignored or changed is refused.
        if self.rollout.with_experience is None:
            self.rollout.with_experience = 0 if self.run.variant == "grpo" else self.rollout.group_size // 2
        elif self.run.variant == "grpo" and self.rollout.with_experience > 0:
            raise ConfigError(f"run.variant grpo shows no experience, but rollout.with_experience is {self.rollout.with_experience}; "
                              "set rollout.with_experience: 0 (or leave it unset)")
        # An endpoint serves inference only: it cannot score sequences for the loss nor take new weights.
        for role, m, trains in (("actor", self.actor, self.trains_actor), ("extractor.model", self.extractor.model, self.trains_extractor)):
            if m.backend == "openai" and trains:
                raise ConfigError(f"{role}.backend: openai serves inference only, and run.variant {self.run.variant} trains the "
                                  f"{role.split('.')[0]} (the loss needs its log-probs and the server cannot take new weights); "
                                  "use hf or vllm, or a variant that keeps it frozen "
                                  f"({'exp_only' if role == 'actor' else 'static'})")

    @property
    def uses_experience(self) -> bool:
        return self.run.variant != "grpo"

    @property
    def trains_actor(self) -> bool:
        return self.run.variant in ("grpo", "static", "complementary")

    @property
    def trains_extractor(self) -> bool:
        return self.run.variant in ("exp_only", "complementary")


def load_run_config(source: str | os.PathLike[str] | dict[str, Any], *, overrides: dict[str, Any] | None = None) -> RunConfig:
    """From a YAML path, a YAML string, or a dict; `overrides` is a nested dict applied on top."""
    if isinstance(source, dict):
        data = dict(source)
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and (
            source.endswith((".yaml", ".yml", "/")) or Path(source).exists())):  # a path, not YAML text (a folder too: named)
        data = load_yaml(source)
    else:
        try:
            data = safe_load_yaml(source) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"the config is not valid YAML: {' '.join(str(e).split())}") from None
        if not isinstance(data, dict):
            raise ConfigError("the config must be a mapping of sections (run, env, actor, rollout, loss, extractor, library, ray)")
    if overrides:
        data = _deep_merge(data, overrides)
    return from_dict(RunConfig, data)


class _Replace(dict):
    """A mapping given whole to a mapping-valued field (`--set env.names={...}`): it replaces the
    file's mapping instead of merging into it (a merge silently trained a probe on two envs)."""


def _is_section(parts: list[str]) -> bool:
    """Whether the dotted path names a config section (a dataclass), not a field."""
    import dataclasses
    import typing

    tp: Any = RunConfig
    for part in parts:
        if not dataclasses.is_dataclass(tp):
            return False
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return False
        tp = hints[part]
    return dataclasses.is_dataclass(tp)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """["run.seed=3", "env.names={minihack/Room-5x5: 1}"] -> nested dict; values are YAML.

    A mapping value merges into a section (`library.manager={top_k: 3}` keeps the other fields) and
    replaces a mapping-valued field (`env.names={minihack/Room-Ultimate-5x5: 1}` is the whole mixture)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set wants section.field=value, got {item!r}")
        try:
            v = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {key}: the value is not valid YAML ({e})") from None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _Replace(v) if isinstance(v, dict) and not _is_section(parts) else v
    return out


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        merge = isinstance(v, dict) and not isinstance(v, _Replace) and isinstance(out.get(k), dict)
        out[k] = _deep_merge(out[k], v) if merge else dict(v) if isinstance(v, _Replace) else v
    return out


def dump_run_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def resolve_model_path(path: str, data_dir: str | os.PathLike[str]) -> str:
    """embedded:policy -> <data_dir>/models/policy; anything else is used as given."""
    if path.startswith(EMBEDDED_PREFIX):
        return str(Path(data_dir) / "models" / path[len(EMBEDDED_PREFIX):])
    return path


def embedded_build_mismatches(cfg: "RunConfig", built: dict[str, Any]) -> list[str]:
    """Where a run's settings differ from those the embedded models were built with (`built`: the build's
    WarmStartConfig as its warmstart.json records it), one line each. Those models learnt from prompts made with the
    build's values (history, turn limit, the search-and-ask offer, the extractor's trajectory length and op budget,
    the compact prompts, the envs), so a run with other values shows them prompts they never saw. Only the roles that
    use `embedded:policy` / `embedded:extractor` are compared."""
    out: list[str] = []

    def differ(field: str, ours: Any, build_field: str, theirs: Any) -> None:
        if ours != theirs:
            out.append(f"{field} is {ours!r} but the embedded models were built with {build_field} {theirs!r} "
                       f"(set {field}: {theirs!r}, or rebuild with `comprl models init --set {build_field}=...`)")

    if cfg.actor.path == f"{EMBEDDED_PREFIX}policy":
        differ("env.max_turns", cfg.env.max_turns, "max_turns", built.get("max_turns"))
        differ("rollout.history_turns", cfg.rollout.history_turns, "history_turns", built.get("history_turns"))
        if cfg.rollout.history_turns or built.get("history_turns"):
            differ("rollout.history_chars", cfg.rollout.history_chars, "history_chars", built.get("history_chars"))
        differ("rollout.prompt_style", cfg.rollout.prompt_style, "prompt style", "compact")
        differ("search-and-ask offered (rollout.search_and_ask > 0)", cfg.rollout.search_and_ask > 0, "allow_tool",
               built.get("allow_tool"))
        unknown = [e for e in cfg.env.names if e not in (built.get("envs") or [])]
        if unknown:
            out.append(f"env.names has {', '.join(unknown)}, but the embedded policy was built on "
                       f"{', '.join(built.get('envs') or [])} only (rebuild with `comprl models init --envs ...`)")
    if cfg.uses_experience and cfg.extractor.model.path in (f"{EMBEDDED_PREFIX}extractor", f"{EMBEDDED_PREFIX}extractor-weak"):
        differ("extractor.trajectory_chars", cfg.extractor.trajectory_chars, "trajectory_chars", built.get("trajectory_chars"))
        differ("extractor.op_budget", cfg.extractor.op_budget, "op_budget", built.get("op_budget"))
    return out


def check_model_paths(cfg: "RunConfig", data_dir: str | os.PathLike[str]) -> None:
    """Refuse, before a run row exists, a model folder that is not there. `embedded:` models are built on
    first use, so only given paths are checked."""
    fields = [("actor.path", cfg.actor.path)]
    if cfg.uses_experience:
        fields.append(("extractor.model.path", cfg.extractor.model.path))
    for name, path in fields:
        if path.startswith(EMBEDDED_PREFIX):
            continue
        folder = Path(resolve_model_path(path, data_dir))
        if not (folder / "config.json").is_file():
            what = "does not exist" if not folder.exists() else "is not a Hugging Face model folder (no config.json)"
            raise ConfigError(f"{name}: {folder} {what}; point it at a model folder, or use embedded:policy / "
                              f"embedded:extractor (built by `comprl models init`)")


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def shipped_configs() -> dict[str, Path]:
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}
