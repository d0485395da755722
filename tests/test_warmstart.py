"""Warm start of the embedded default models (trainers/warmstart/), on a tiny config."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from trainers import prompts as P
from trainers import warmstart as W
from trainers.warmstart import build as WB  # where the build looks its stages up (monkeypatched below)
from trainers.models import build_tiny_qwen2, build_tokenizer, load_backend

DELTAS = {"north": (-1, 0), "east": (0, 1), "south": (1, 0), "west": (0, -1),
          "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1)}


def tiny(**kw) -> W.WarmStartConfig:
    base = dict(envs=["minihack/Room-5x5"], demo_episodes=6, dagger_episodes=2, dagger_max_turns=3, policy_steps=3,
                extractor_steps=2, batch_size=2, extractor_batch_size=2, vocab_size=400, policy_hidden=32,
                policy_layers=1, policy_heads=2, policy_kv_heads=1, extractor_hidden=32, extractor_layers=1,
                extractor_heads=2, extractor_kv_heads=1, max_positions=2048, max_seq_len=2000, eval_episodes=1,
                eval_extractor=2, extractor_max_new_tokens=8, action_max_new_tokens=3, warmup_steps=1,
                extractor_short_steps=2, extractor_short_batch_size=2)
    base.update(kw)
    return W.WarmStartConfig(**base)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data = tmp_path_factory.mktemp("ws")
    cfg = tiny(threads=2)  # two threads: the extractor trains in a spawned process beside the policy
    t0 = time.time()
    paths = W.ensure_models(data, cfg, progress=False)
    return data, cfg, paths, time.time() - t0


@pytest.mark.slow
def test_ensure_models_builds_loadable_folders(built):
    data, cfg, paths, _ = built
    assert set(paths) == {"policy", "extractor"}
    for name, p in paths.items():
        assert p == Path(data) / "models" / name
        marker = json.loads((p / W.MARKER).read_text())
        assert marker["hash"] == cfg.digest() and marker["role"] == name
        backend = load_backend("hf", p, device="cpu", quiet=True)
        out = backend.chat([P.actor_messages(action_format="Move with compass words.", task="t", observation="o")],
                           max_new_tokens=2, temperature=0.0)
        assert len(out) == 1
    res = json.loads((paths["policy"] / W.MARKER).read_text())["results"]
    assert set(res["policy"]["eval"]) == {f"minihack/Room-5x5/{c}" for c in ("none", "correct", "wrong")}
    assert 0.0 <= res["extractor"]["eval"]["parse_rate"] <= 1.0
    assert res["extractor"]["beside_the_policy"] is True and res["threads"] == 2
    assert res["extractor"]["short_prompt"]["steps"] == cfg.extractor_short_steps if cfg.extractor_short_steps >= 10 else True
    assert res["example_counts"]["extractor/extract"] > 0 and res["cpu_s"] > 0
    assert not list((Path(data) / "models").glob(".building-*"))


@pytest.mark.slow
def test_extractor_failure_beside_the_policy_is_reported_and_leaves_nothing(tmp_path):
    """The extractor's build process fails (an extractor shape the model cannot run: 3 key/value heads for 2 query
    heads; the policy's is fine): the build raises with the child's reason and leaves no half-built folder."""
    cfg = tiny(threads=2, extractor_kv_heads=3, demo_episodes=3, dagger_episodes=0)
    with pytest.raises(RuntimeError, match="the extractor's build process failed: [A-Za-z]+Error: "):
        W.ensure_models(tmp_path, cfg, progress=False)
    assert not (tmp_path / "models" / "policy").exists() and not list((tmp_path / "models").glob(".building-*"))


@pytest.mark.slow
def test_ensure_models_is_idempotent(built):
    data, cfg, paths, _ = built
    before = {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in paths.items()}
    t0 = time.time()
    again = W.ensure_models(data, cfg, progress=False)
    assert time.time() - t0 < 1.0
    assert again == paths
    assert {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in paths.items()} == before


@pytest.mark.slow
def test_default_request_does_not_replace_a_custom_build(built, capsys):
    """`embedded:` paths ask for the default build; over a custom one (here the tiny config) they get
    a one-line error naming the way out, and the custom models stay as they were."""
    from app.cli import main
    from trainers.models import BackendError

    data, _, paths, _ = built
    before = {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in paths.items()}
    assert json.loads((paths["policy"] / W.MARKER).read_text())["custom"] is True
    with pytest.raises(BackendError, match="custom warm start .*demo_episodes=.*Name the custom models by path"):
        W.ensure_models(data, progress=False)
    assert main(["models", "init", "--data-dir", str(data)]) != 0
    err = capsys.readouterr().err
    assert "custom warm start" in err and "--force" in err and "Traceback" not in err
    assert {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in paths.items()} == before


@pytest.mark.slow
def test_config_change_rebuilds_and_interruption_keeps_the_old_models(built, monkeypatch):
    data, cfg, paths, _ = built
    old_hash = cfg.digest()

    def boom(*a, **k):
        raise KeyboardInterrupt

    # An interrupted rebuild leaves the complete old folders and nothing half-built.
    monkeypatch.setattr(WB, "_train_extractor", boom)  # in this process: parallel=False
    with pytest.raises(KeyboardInterrupt):
        W.ensure_models(data, tiny(seed=1, parallel=False), progress=False)
    assert json.loads((paths["policy"] / W.MARKER).read_text())["hash"] == old_hash
    assert not list((Path(data) / "models").glob(".*"))
    monkeypatch.undo()

    new = tiny(seed=1)
    W.ensure_models(data, new, progress=False)
    for p in paths.values():
        assert json.loads((p / W.MARKER).read_text())["hash"] == new.digest() != old_hash


@pytest.mark.slow
def test_interrupted_first_build_leaves_no_folder(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(WB, "_train_extractor", boom)
    with pytest.raises(RuntimeError):
        W.ensure_models(tmp_path, tiny(demo_episodes=2, dagger_episodes=0, parallel=False), progress=False)
    root = tmp_path / "models"
    assert not (root / "policy").exists() and not (root / "extractor").exists()
    assert not list(root.glob(".*"))


def test_interrupted_policy_stops_the_extractor_beside_it(tmp_path, monkeypatch):
    """Interrupted while the extractor trains in its own process: that process is stopped, nothing is left."""
    import multiprocessing

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(WB, "policy_examples", boom)  # the policy's first step, after the extractor's process started
    with pytest.raises(KeyboardInterrupt):
        W.ensure_models(tmp_path, tiny(demo_episodes=2, dagger_episodes=0, threads=2), progress=False)
    assert not multiprocessing.active_children()
    root = tmp_path / "models"
    assert not (root / "policy").exists() and not (root / "extractor").exists() and not list(root.glob(".*"))


@pytest.fixture(scope="module")
def ultimate_demos():
    cfg = tiny(envs=["minihack/Room-Ultimate-5x5"], demo_episodes=24, noisy_share=0.3)
    return cfg, W.collect_demos(cfg)


def test_policy_loss_mask_covers_only_the_action(ultimate_demos):
    cfg, demos = ultimate_demos
    texts = [json.dumps(W._actor_prompt(cfg, d, t)) + t.label for d in demos for t in d.turns[:3]]
    tok = build_tokenizer(texts, vocab_size=500)
    examples, dropped = W.policy_examples(demos, tok, cfg)
    assert dropped == 0 and len(examples) == sum(len(d.turns) for d in demos)
    labels_in_order = [t.label for d in demos for t in d.turns]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for ex, label, (d, t) in zip(examples, labels_in_order, [(d, t) for d in demos for t in d.turns]):
        n_prompt = next(i for i, lab in enumerate(ex.labels) if lab != W.IGNORE)
        assert all(lab == W.IGNORE for lab in ex.labels[:n_prompt])
        assert ex.labels[n_prompt:] == ex.input_ids[n_prompt:]  # every token after the prompt is a target
        assert ex.input_ids[-1] == end
        assert tok.decode(ex.input_ids[n_prompt:], skip_special_tokens=True) == W.ACTION_LEAD + label
        prompt = tok.apply_chat_template(W._actor_prompt(cfg, d, t), add_generation_prompt=True, tokenize=True)
        prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
        assert ex.input_ids[:n_prompt] == list(prompt)  # the rollout's exact prompt


def test_short_prompt_examples_hold_only_the_task_the_entry_and_the_observation(ultimate_demos):
    """The copy curriculum's examples (`short_prompt_steps`): the user message with the entry but without
    history, no system message, the same action as the target, and on MiniHack only the turns whose action
    can be read off it (the entry's heading before the staircase is seen, the observation's after)."""
    cfg, demos = ultimate_demos
    tok = build_tokenizer([json.dumps(W._actor_prompt(cfg, d, t)) + t.label for d in demos for t in d.turns[:3]], vocab_size=500)
    short, dropped = W.policy_examples(demos, tok, cfg, short=True)
    copyable = [(d, t) for d in demos for t in d.turns if W._copyable(d, t)]
    assert dropped == 0 and 0 < len(short) == len(copyable) < sum(len(d.turns) for d in demos)
    for d, t in copyable:
        assert f"a step {t.label} brings" in t.observation or f"head {t.label}." in d.entry
    d, t = next((d, t) for d, t in copyable if d.entry)
    msgs = W._short_prompt(d, t)
    assert [m["role"] for m in msgs] == ["user"]
    assert msgs[0]["content"] == (f"Task: {d.task}\nObservation:\n{t.observation}\n"
                                  + P.EXPERIENCE_BLOCK.format(experience=d.entry.strip()) + "Your action:")
    full = W._join(tok, W._chat_ids(tok, W._actor_prompt(cfg, d, t)), W.ACTION_LEAD + t.label, "full")
    ex = short[copyable.index((d, t))]
    n_s = next(i for i, lab in enumerate(ex.labels) if lab != W.IGNORE)
    n_f = next(i for i, lab in enumerate(full.labels) if lab != W.IGNORE)
    assert ex.input_ids[n_s:] == full.input_ids[n_f:] and n_s <= n_f  # same target, shorter prompt
    assert ex.kind.startswith("policy/short/")
    # The reply's first token is the very token the prompt names the move with (ACTION_LEAD): a copy, not a mapping.
    for (d, t), ex in zip(copyable, short):
        n = next(i for i, lab in enumerate(ex.labels) if lab != W.IGNORE)
        assert ex.input_ids[n] in ex.input_ids[:n], (t.label, d.entry)

def test_demonstration_mix_and_recovery_states(ultimate_demos):
    cfg, demos = ultimate_demos
    conds = {c: sum(d.condition == c for d in demos) for c in ("none", "correct", "wrong")}
    assert all(conds.values()), conds
    noisy = [t for d in demos if d.source == "noisy" for t in d.turns]
    assert any(t.taken != t.label for t in noisy)  # states after a mistake, labelled by the expert
    very = W.collect_demos(tiny(envs=["minihack/Room-Ultimate-5x5"], demo_episodes=6, noisy_share=1.0, noise_eps=0.6))
    assert any(t.taken in W._INVALID_WORDS for d in very for t in d.turns)  # and words the env refuses
    for d in demos:
        if d.condition == "none":
            assert d.entry == ""
        else:
            assert d.entry.startswith("## Title: ") and "\n## Description: " in d.entry and "\n## Content: " in d.entry


def test_teacher_reads_the_entry_heading_until_the_staircase_is_in_view(ultimate_demos):
    """The dark room's teacher is a reader a small model can imitate. Correct entry: while the staircase is out of
    sight, every action is the entry's heading (`first_heading` of its claim), until a step leaves the agent where it
    was with no monster ahead (a wall: then it explores); once the staircase is on the map, the step the observation
    names. Wrong entry that claims a place: the same reading of a wrong heading. Wrong entry about something else:
    the expert acts exactly as without one."""
    cfg, demos = ultimate_demos
    from envs.minihack import claimed_offset, first_heading, stairs_sentence
    from envs.registry import make_env

    env = make_env("minihack/Room-Ultimate-5x5", max_turns=16)
    teacher = W._Teacher(env)
    read = named = followed_wrong = ignored = 0
    import random

    def in_sight() -> bool:
        return any(">" in line for line in env.grid)

    for seed in range(40):
        obs, entry, facts = teacher.start(seed, "correct", random.Random(0))
        if facts["offset"] is None:
            continue
        dr, dc = facts["offset"]
        assert stairs_sentence(dr, dc) in entry.lower() and claimed_offset(entry) == (dr, dc)
        before = None
        for _ in range(16):
            a = teacher.action("correct")
            if "cannot escape" in env.message.lower():
                break
            if in_sight():
                assert f"a step {a} brings you closer" in obs  # the observation's own word
                named += 1
            elif teacher.following:
                assert a == first_heading(dr, dc)
                read += 1
            else:
                assert before == env.agent_pos  # the reading ended at a bump
                break
            before = env.agent_pos
            obs, _, term, trunc, _ = env.step(a)
            if term or trunc:
                break
        for rseed in range(3):
            _, entry, _ = teacher.start(seed, "wrong", random.Random(rseed))
            claim = claimed_offset(entry)
            if claim is None:  # advice about another kind of task: ignored
                first_wrong = teacher.action("wrong")
                teacher.start(seed, "none", random.Random(rseed))
                assert first_wrong == teacher.action("none")
                ignored += 1
            elif not in_sight():
                followed_wrong += teacher.action("wrong") == first_heading(*claim)
    env.close()
    assert read >= 20 and named >= 20 and followed_wrong >= 20 and ignored >= 3
    # And reading pays: with a correct entry the expert needs fewer actions.
    mean = lambda c: sum(len(d.turns) for d in demos if d.condition == c and d.source == "expert") / max(1, sum(d.condition == c and d.source == "expert" for d in demos))
    assert mean("correct") < mean("none")


def test_extractor_teacher_answers_parse(ultimate_demos):
    cfg, demos = ultimate_demos
    tok = build_tokenizer([W._extractor_target(d)[1] for d in demos], vocab_size=500)
    examples, _ = W.extractor_examples(demos, tok, cfg)
    kinds = {e.kind for e in examples}
    assert kinds == {"extractor/extract", "extractor/rewrite", "extractor/merge"}
    for d in demos:
        ops, answer = W._extractor_target(d)
        parsed = W.parse_extractor_answer(answer, n_previous=1 if d.entry else 0)  # the parser training uses
        assert [(p.kind, p.text, p.ids) for p in parsed] == [
            (op["function"], op.get("new_memory") or op.get("updated_memory"), op.get("idx_list", [])) for op in ops]
        for op in ops:
            text = op.get("new_memory") or op.get("updated_memory")
            assert text.startswith("## Title: ") and "## Content: " in text
    for ex in examples:
        n_prompt = next(i for i, lab in enumerate(ex.labels) if lab != W.IGNORE)
        target = tok.decode(ex.input_ids[n_prompt:], skip_special_tokens=True)
        assert target.startswith("<think>") and target.endswith("</answer>")


def test_parse_extractor_answer_rejects_malformed():
    good = '<think>x</think><answer>[{"function": "add", "new_memory": "## Title: a\\n## Description: b\\n## Content: c"}]</answer>'
    assert W.parse_extractor_answer(good) is not None
    assert W.parse_extractor_answer("<think>x</think><answer>[]</answer>") == []
    assert W.parse_extractor_answer("<answer>[]</answer>") == []  # <think> is not required (nor by the release)
    assert W.parse_extractor_answer('<think>x</think><answer>[{"function": "update", "idx_list": [0], "updated_memory": "m"}]</answer>') is None
    assert W.parse_extractor_answer("<think>x</think><answer>[{]</answer>") is None
    assert W.parse_extractor_answer('<think>x</think><answer>[{"function": "update", "idx_list": [3], "updated_memory": "m"}]</answer>', n_previous=1) is None
    assert W.parse_extractor_answer('<think>x</think><answer>[{"function": "delete"}]</answer>') is None


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="envs"):
        W.WarmStartConfig(envs=["webshop"])
    with pytest.raises(ValueError, match="policy_steps"):
        W.WarmStartConfig(policy_steps=0)
    assert W.WarmStartConfig().digest() != W.WarmStartConfig(seed=5).digest()


@pytest.mark.slow
def test_models_command_list(built, capsys):
    data, _, _, _ = built
    assert W.models_command("list", str(data)) == 0
    out = capsys.readouterr().out
    assert "policy:" in out and "extractor:" in out and "params" in out and "parse rate" in out
    assert W.models_command("bogus", str(data)) == 2


def test_merge_teacher_chunks_parse_with_the_runs_parser(ultimate_demos):
    """The merge answers the extractor is taught are what `ExtractorLoop.merge` accepts: entries that
    say the same thing collapse into the first listed one, entries for another task are discarded."""
    import random

    from core.types import Experience
    from trainers.extractor import parse_merge

    _, demos = ultimate_demos
    rng = random.Random(0)
    kinds = set()
    for _ in range(40):
        entries, ops, answer = W._merge_chunk(rng.sample(demos, k=min(len(demos), 24)), rng)
        assert 1 <= len(entries) <= 5
        parsed = parse_merge(answer, [Experience(id=100 + i, text=t) for i, t in enumerate(entries)])
        assert parsed is not None and len(parsed) == len(ops)
        for op, p in zip(ops, parsed):
            kinds.add(op["function"])
            assert p.ids == [100 + i for i in op["idx_list"]]
            if op["function"] == "merge":
                assert p.kind == "update" and p.text == entries[op["idx_list"][0]]
                assert len({W._merge_key(entries[i]) for i in op["idx_list"]}) == 1
            else:
                assert p.kind == "discard" and all(demos[0].task not in entries[i] for i in op["idx_list"])
    assert "merge" in kinds


@pytest.mark.slow
def test_alfworld_warm_start_builds_and_the_study_names_it_by_path(tmp_path, monkeypatch):
    """A warm start on ALFWorld (`comprl models init --envs alfworld/...`): the scripted ALFWorld expert's
    demonstrations train loadable models, and the study passes them by path (embedded: means the default)."""
    import sys

    cfg = tiny(envs=["alfworld/pick_and_place"], short_prompt_steps=2)
    paths = W.ensure_models(tmp_path, cfg, progress=False)
    marker = json.loads((paths["policy"] / W.MARKER).read_text())
    assert marker["config"]["envs"] == ["alfworld/pick_and_place"]
    assert marker["results"]["policy"]["short_prompt"]["steps"] == 2  # the copy curriculum ran first
    assert marker["results"]["timings_s"]["policy SFT (short prompts)"] <= marker["results"]["timings_s"]["policy SFT"]
    assert set(marker["results"]["policy"]["eval"]) == {f"alfworld/pick_and_place/{c}" for c in ("none", "correct", "wrong")}
    assert marker["results"]["policy"]["action_max_new_tokens"] > cfg.action_max_new_tokens  # room for "take X from Y"
    ev = marker["results"]["policy"]["eval"]["alfworld/pick_and_place/none"]
    assert ev["invalid_share"] == 0  # ALFWorld is played within its admissible commands (teachers.CONSTRAINED_ENVS)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.study import prepare_models, unseen_families

    models, sets = prepare_models(tmp_path, tmp_path / "work", False, Path("configs/alfworld_cpu.yaml"))
    assert models == tmp_path / "models"
    assert sets == [f"actor.path={paths['policy']}", f"extractor.model.path={paths['extractor']}"]
    plan = [{"config": Path(__file__).resolve().parents[1] / c} for c in ("configs/alfworld_cpu.yaml", "configs/minihack_room_cpu.yaml")]
    warn = unseen_families(plan, models)
    assert len(warn) == 1 and warn[0].startswith("warning: minihack_room_cpu.yaml plays minihack")


def test_action_budget_covers_the_longest_demonstrated_action():
    """The rollouts' per-turn token budget fits every demonstrated action and its end token: ALFWorld's
    "take X from Y" is longer than the 8 tokens that suit MiniHack's compass words, and a budget that cuts
    them leaves the DAgger and evaluation rollouts no way to succeed."""
    cfg = tiny(envs=["alfworld/pick_and_place"], demo_episodes=3, noisy_share=0.0)
    demos = W.collect_demos(cfg)
    labels = {t.label for d in demos for t in d.turns}
    assert any(a.startswith("take ") for a in labels)  # "take egg 1 from countertop 2": 8 pieces before any merge
    tok = build_tokenizer(sorted(labels), vocab_size=300)
    longest = max(len(tok(W.ACTION_LEAD + a, add_special_tokens=False)["input_ids"]) for a in labels)
    assert W.action_token_budget(tok, demos, cfg) == max(cfg.action_max_new_tokens, longest + 1)
    assert longest + 1 > 8  # the old fixed budget would have cut it
    assert W.action_token_budget(tok, demos, tiny(action_max_new_tokens=64)) == 64
    assert W.action_token_budget(tok, [], cfg) == cfg.action_max_new_tokens


def test_models_init_rejects_envs_without_an_expert(tmp_path):
    with pytest.raises(ValueError, match="unknown env"):
        W.models_command("init", str(tmp_path), envs=["alfworld/nope"])
    with pytest.raises(ValueError, match="no warm-start demonstrations"):
        W.models_command("init", str(tmp_path), envs=["webshop"])
    with pytest.raises(ValueError, match="policy_steps"):
        W.models_command("init", str(tmp_path), policy_steps=0)
    assert not (tmp_path / "models").exists()


def test_models_init_set_overrides_any_field(tmp_path, monkeypatch):
    """`comprl models init --set FIELD=VALUE`: YAML values reach WarmStartConfig type-checked; a bad field,
    type, section or a repeat of a dedicated flag is refused before anything is built."""
    seen = {}
    monkeypatch.setattr(WB, "ensure_models", lambda data_dir, cfg, force=False: seen.setdefault("cfg", cfg) and {})
    assert W.models_command("init", str(tmp_path), envs=["alfworld/pick_and_place"], policy_steps=7,
                            overrides=["policy_hidden=256", "dagger_episodes=96", "lr=5e-4"]) == 0
    cfg = seen["cfg"]
    assert (cfg.envs, cfg.policy_steps, cfg.policy_hidden, cfg.dagger_episodes, cfg.lr) == (
        ["alfworld/pick_and_place"], 7, 256, 96, 5e-4)
    assert cfg.digest() != W.WarmStartConfig(envs=["alfworld/pick_and_place"], policy_steps=7).digest()
    for bad, msg in [(["bogus=1"], "unknown config field bogus"), (["policy_hidden=big"], "wrong type"),
                     (["policy_hidden=250"], "divisible"), (["a.b=1"], "no sections"), (["policy_hidden"], "field=value")]:
        with pytest.raises(ValueError, match=msg):
            W.models_command("init", str(tmp_path), overrides=bad)
    with pytest.raises(ValueError, match="repeats --policy-steps"):
        W.models_command("init", str(tmp_path), policy_steps=5, overrides=["policy_steps=3"])
    assert not (tmp_path / "models").exists()


def test_prompt_loss_weight_trains_the_prompt_and_reports_the_action_loss():
    """WarmStartConfig.prompt_loss_weight adds a next-token loss on the prompt's tokens: with it the
    model learns the prompts, without it only the actions; the reported loss is the action's alone."""
    import torch

    from trainers.models import build_tiny_qwen2

    prompts = [f"Task: put a {o} in {r}. You see a {o} 1 and a {p} 2." for o, r, p in
               [("watch", "safe", "pen"), ("apple", "fridge", "mug"), ("pen", "drawer", "watch"), ("mug", "shelf", "apple")]]
    tok = build_tokenizer(prompts + [f"take {o} 1" for o in ("watch", "apple", "pen", "mug")], vocab_size=300)
    examples = [W._join(tok, W._chat_ids(tok, [{"role": "user", "content": p}]), f"take {p.split()[3]} 1", "t")
                for p in prompts]
    cfg = tiny(lr=3e-3, warmup_steps=1)

    def prompt_ce(model) -> float:
        total, n = 0.0, 0
        with torch.no_grad():
            for e in examples:
                ids = torch.tensor([e.input_ids])
                logits = model(input_ids=ids).logits[0, :-1]
                mask = torch.tensor([lab == W.IGNORE for lab in e.labels[1:]])
                total += float(torch.nn.functional.cross_entropy(logits[mask], ids[0, 1:][mask], reduction="sum"))
                n += int(mask.sum())
        return total / n

    runs = {}
    for w in (0.0, 1.0):
        model = build_tiny_qwen2(tok, 32, 1, 2, 1, max_pos=512, seed=0)
        before = prompt_ce(model)
        _, losses = W._sft(model, examples, 40, cfg, pad_id=int(tok.pad_token_id), seed=0, batch_size=4, prompt_loss_weight=w)
        runs[w] = (before, prompt_ce(model), losses)
    (b0, a0, l0), (b1, a1, l1) = runs[0.0], runs[1.0]
    assert b0 == pytest.approx(b1)  # same init
    assert l0[0] == pytest.approx(l1[0], rel=1e-5)  # the reported loss is the action's, whatever the weight
    assert a1 < 0.7 * b1  # the prompt was learned with the weight (measured 5.68 -> 3.29 nats)...
    assert a1 < a0 - 1.0  # ...and far less without it (5.68 -> 5.07)
    assert l0[-1] < 0.5 * l0[0] and l1[-1] < 0.5 * l1[0]  # the action is learned either way


def test_extraction_copies_lie_at_one_distance_for_every_level(ultimate_demos):
    """MiniHack extraction: the think is the debrief word for word. Where it says where the staircase was, the one op
    is an add whose content repeats its sentence (the checker reads the level's true offset back), and in tokens the
    think's copy and the entry's copy each lie at one distance behind what they repeat, whatever the level: what
    lets a tiny extractor copy by position. Where the staircase was never seen, nothing is written ([])."""
    from envs.minihack import claimed_offset

    cfg, demos = ultimate_demos
    tok = W.demo_tokenizer(dataclasses.replace(cfg, vocab_size=2048), demos)  # the default's size: whole words
    to_think, to_entry, stated, kept = set(), set(), 0, 0
    for d in demos:
        ops, answer = W._extractor_target(d)
        quote = W._debrief_quote(d)
        assert answer.startswith(f"<think>{W._debrief(d)}</think>") and W._debrief(d).startswith("Debrief: ")
        if not quote:
            assert ops == [] and "never saw" in W._debrief(d)
            kept += 1
            continue
        stated += 1
        (op,) = ops
        assert op["function"] == "add" and list(op)[0] == "new_memory"
        assert claimed_offset(list(op.values())[0]) == tuple(d.facts["offset"])
        ids = W._join(tok, W._chat_ids(tok, W._extractor_prompt(cfg, d)), answer, "x").input_ids
        span = tok.encode(quote.split("was ", 1)[1].rstrip("."), add_special_tokens=False)
        hits = [i for i in range(len(ids) - len(span) + 1) if ids[i:i + len(span)] == span]
        to_think.add(hits[-2] - hits[-3])
        to_entry.add(hits[-1] - hits[-2])
        # the short curriculum ends its prompt the same way
        short = W._join(tok, W._chat_ids(tok, W._extractor_prompt(cfg, d, short=True)), answer, "x").input_ids
        s_hits = [i for i in range(len(short) - len(span) + 1) if short[i:i + len(span)] == span]
        assert s_hits[-2] - s_hits[-3] in to_think
    assert stated >= 10 and kept >= 1
    assert len(to_think) == 1 and len(to_entry) == 1


def test_dagger_rollouts_are_the_rollers_with_the_sft_prompt_and_labels_on_their_states(ultimate_demos, tmp_path):
    """One episode loop: the warm start's DAgger episodes are played by the Roller (trainers/rollout.py) on teacher
    envs. Every prompt the model generated from is the SFT example's prompt for that state (W._actor_prompt), and
    every label is the teacher's action in the state the action was taken from (replayed on a fresh TeacherEnv)."""
    from collections import Counter

    from trainers.models import save_model_folder
    from trainers.rollout import derive_seed

    cfg, demos = ultimate_demos
    cfg = dataclasses.replace(cfg, rollout_batch=4)
    tok = build_tokenizer([json.dumps(W._actor_prompt(cfg, d, t)) + t.label for d in demos for t in d.turns[:3]],
                          vocab_size=500)
    save_model_folder(build_tiny_qwen2(tok, 32, 1, 2, 1, max_pos=2048, seed=0), tok, tmp_path / "p")
    backend = load_backend("hf", tmp_path / "p", device="cpu", quiet=True)
    seen: list[tuple[int, ...]] = []
    generate = backend.generate

    def recording(prompts, **kw):
        seen.extend(tuple(p) for p in prompts)
        return generate(prompts, **kw)

    backend.generate = recording
    name = cfg.envs[0]
    specs = [(name, 50 + i, ("none", "correct", "wrong")[i % 3]) for i in range(6)]
    dag = W._rollouts(backend, cfg, specs, temperature=1.0, seed=5, source="dagger", max_turns=3, max_new_tokens=3)
    assert [(d.seed, d.condition) for d in dag] == [(s, c) for _, s, c in specs]
    assert all(1 <= len(d.turns) <= 3 and d.source == "dagger" for d in dag)
    expected = [tuple(W._chat_ids(tok, W._actor_prompt(cfg, d, t))) for d in dag for t in d.turns]
    assert Counter(seen) == Counter(expected)
    for (n, s, c), d in zip(specs, dag):
        te = W.TeacherEnv(cfg, n)
        try:
            obs, info = te.reset(seed=s, options={"condition": c, "noise_eps": 0.0, "entry_seed": derive_seed(5, n, s, c)})
            assert te.entry == d.entry and te.task == d.task
            for t in d.turns:
                assert (t.observation, t.label) == (obs, info["expert_action"])
                obs, _, term, trunc, info = te.step(t.taken)
        finally:
            te.close()


def test_scripted_demonstrations_are_played_by_the_roller_without_a_model(ultimate_demos):
    """Expert episodes (no actor): what each turn took is the label, except a noisy episode's random actions; the
    expert reaches the staircase on a lit room's seeds; the same config gives the same demonstrations."""
    cfg, demos = ultimate_demos
    clean = [d for d in demos if d.source == "expert"]
    assert clean and all(t.taken == t.label for d in clean for t in d.turns)
    lit = W.collect_demos(tiny(demo_episodes=8, noisy_share=0.0))
    assert all(d.success for d in lit) and all(d.turns for d in lit)
    again = W.collect_demos(tiny(demo_episodes=8, noisy_share=0.0))
    assert [(d.seed, d.condition, d.entry, [(t.observation, t.taken) for t in d.turns]) for d in lit] == \
           [(d.seed, d.condition, d.entry, [(t.observation, t.taken) for t in d.turns]) for d in again]
