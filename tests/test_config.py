"""Run configs: every shipped YAML loads; a bad field or value is refused with its name."""
from __future__ import annotations

import pytest

from core.config import ConfigError
from trainers.config import load_run_config, shipped_configs


def test_every_shipped_config_loads():
    names = shipped_configs()
    assert "minihack_room_cpu" in names and "paper_gpu" in names
    for path in names.values():
        cfg = load_run_config(path)
        assert cfg.env.names


@pytest.mark.parametrize("text,field", [
    ("run: {variant: ppo}", "run.variant"),
    ("run: {max_stesp: 3}", "run.max_stesp"),
    ("rollout: {group_size: 4, with_experience: 6}", "rollout.with_experience"),
    ("actor: {lr: fast}", "actor.lr"),
    ("env: {names: {minihack/Room-5x5: -1}}", "env.names"),
    ("library: {index: {kind: annoy}}", "index.kind"),
    ("extractor: {model: {backend: tgi}}", "backend"),
    ("run: [1, 2]", "run"),
    ("run: {variant: grpo", "not valid YAML"),
])
def test_bad_values_name_the_field(text, field):
    with pytest.raises(ConfigError) as e:
        load_run_config(text + "\n")
    assert field in str(e.value)


def test_partial_sections_keep_their_defaults():
    cfg = load_run_config("extractor: {model: {lr: 3.0e-6}}\n")
    assert cfg.extractor.model.path == "embedded:extractor" and cfg.extractor.model.lr == 3e-6
    assert load_run_config("run: {variant: grpo}\n").rollout.with_experience == 0


def test_exponent_without_a_dot_is_a_float():
    """YAML 1.1 reads `3e-4` as a string; a learning rate written that way must still work."""
    from trainers.config import load_run_config, parse_overrides

    cfg = load_run_config({**parse_overrides(["actor.lr=3e-4", "extractor.model.lr=1E-5"])})
    assert cfg.actor.lr == 3e-4 and cfg.extractor.model.lr == 1e-5
    with pytest.raises(Exception, match="actor.lr"):
        load_run_config(parse_overrides(["actor.lr=fast"]))


def test_set_replaces_a_mapping_field_but_merges_into_a_section():
    """`--set env.names={...}` is the whole mixture (it used to merge: a probe trained on two envs);
    `--set library.manager={...}` still keeps the section's other fields."""
    from trainers.config import CONFIG_DIR, load_run_config, parse_overrides

    path = CONFIG_DIR / "minihack_room_cpu.yaml"
    base = load_run_config(path)
    cfg = load_run_config(path, overrides=parse_overrides(["env.names={minihack/Room-5x5: 1.0}",
                                                           "library.manager={top_k: 3}"]))
    assert cfg.env.names == {"minihack/Room-5x5": 1.0} and list(base.env.names) != ["minihack/Room-5x5"]
    assert cfg.library.manager.top_k == 3
    assert cfg.library.manager.diversify == base.library.manager.diversify
    cfg = load_run_config(path, overrides=parse_overrides(["env.names.minihack/Room-5x5=1.0"]))  # one key: added
    assert set(cfg.env.names) == set(base.env.names) | {"minihack/Room-5x5"}


def test_grpo_config_is_the_cpu_default_without_experience():
    """minihack_room_grpo_cpu.yaml is the baseline *of the default*: same env, budget and learner."""
    from trainers.config import CONFIG_DIR, load_run_config

    a = load_run_config(CONFIG_DIR / "minihack_room_cpu.yaml")
    b = load_run_config(CONFIG_DIR / "minihack_room_grpo_cpu.yaml")
    assert b.run.variant == "grpo" and b.rollout.with_experience == 0
    for sec, f in [("env", "names"), ("env", "max_turns"), ("env", "task_set"), ("actor", "lr"), ("actor", "lr_warmup"), ("actor", "temperature"),
                   ("actor", "path"), ("loss", "aggregation"), ("rollout", "tasks_per_step"), ("rollout", "group_size"),
                   ("run", "max_steps"), ("run", "warmup_steps"), ("run", "eval_every"), ("run", "eval_episodes"),
                   ("run", "eval_at_start")]:
        assert getattr(getattr(a, sec), f) == getattr(getattr(b, sec), f), f"{sec}.{f}"


def test_room_random_config_has_the_default_learner_on_the_lit_room():
    """minihack_room_random_cpu.yaml is the lit room with fresh random seeds (no task set) and the CPU default's
    learner, field for field (no drift)."""
    from trainers.config import CONFIG_DIR, load_run_config

    a = load_run_config(CONFIG_DIR / "minihack_room_cpu.yaml")
    b = load_run_config(CONFIG_DIR / "minihack_room_random_cpu.yaml")
    assert a.env.task_set > 0 and b.env.task_set == 0 and list(b.env.names) == ["minihack/Room-Random-5x5"]
    assert a.actor == b.actor and a.loss == b.loss and a.extractor == b.extractor
    assert (a.rollout.group_size, a.rollout.with_experience) == (b.rollout.group_size, b.rollout.with_experience)


def test_a_retired_field_in_an_old_run_config_is_dropped_with_a_warning():
    """A run saved before a field was removed still loads (to be evaluated or resumed); a typo still fails."""
    with pytest.warns(UserWarning, match="library.merge.every_actor_updates"):
        cfg = load_run_config("library: {merge: {every_actor_updates: 5, chunk_size: 4}}\n")
    assert cfg.library.merge.chunk_size == 4
    with pytest.raises(ConfigError, match="library.merge.every_actor_update"):
        load_run_config("library: {merge: {every_actor_update: 5}}\n")


def test_a_config_never_silently_means_something_else():
    """Fields that would be ignored or rewritten are refused with the fix named; unset with_experience
    resolves to K/2 for the experience variants and 0 for grpo."""
    from trainers.config import CONFIG_DIR

    assert load_run_config("run: {variant: grpo}\n").rollout.with_experience == 0
    assert load_run_config("run: {variant: complementary}\nrollout: {group_size: 6}\n").rollout.with_experience == 3
    assert load_run_config("run: {variant: static}\nrollout: {with_experience: 8}\n").rollout.with_experience == 8
    with pytest.raises(ConfigError, match=r"grpo .* rollout.with_experience is 4; set rollout.with_experience: 0"):
        load_run_config("run: {variant: grpo}\nrollout: {with_experience: 4}\n")
    # an endpoint for a role that trains, an endpoint without its URL, a URL without the endpoint (tests/test_chat_prompts.py
    # has the roles that may use one)
    url = "base_url: 'http://127.0.0.1:8000/v1'"
    for text, field in [(f"actor: {{backend: openai, {url}}}\n", "actor.backend: openai serves inference only"),
                        (f"extractor: {{model: {{backend: openai, {url}}}}}\n", "extractor.model.backend: openai serves inference only"),
                        ("run: {variant: exp_only}\nactor: {backend: openai}\n", "needs base_url"),
                        (f"actor: {{{url}}}\n", "base_url belongs to backend openai"),
                        (f"extractor: {{model: {{{url}}}}}\n", "base_url belongs to backend openai")]:
        with pytest.raises(ConfigError, match=field):
            load_run_config(text)
    # every shipped config loads, and runs as plain GRPO once with_experience is 0
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        cfg = load_run_config(path)
        assert 0 <= cfg.rollout.with_experience <= cfg.rollout.group_size
        grpo = load_run_config(path, overrides={"run": {"variant": "grpo"}, "rollout": {"with_experience": 0}})
        assert grpo.rollout.with_experience == 0 and not grpo.uses_experience


@pytest.mark.parametrize("text,says", [
    ("env: {names: {minihack/Room-9x9: 1.0}}", "env.names: unknown env 'minihack/Room-9x9'; known envs: alfworld/all"),
    ("env: {max_turns: -5}", "env.max_turns must be >= 0"),
    ("actor: {temperature: -1}", "actor.temperature must be >= 0"),
    ("extractor: {model: {temperature: -0.5}}", "extractor.model.temperature must be >= 0"),
    ("env: {names: {minihack/Room-5x5: 1}}\nrun: {seed: 1}\nenv: {max_turns: 3}", "line 3: key 'env' is given twice"),
    ("run: {seed: 1, seed: 2}", "key 'seed' is given twice"),
    ("extractor: {templates_file: /no/such/templates.yaml}", "extractor.templates_file: templates file /no/such/templates.yaml does not exist"),
    ("extractor: {templates_file: /tmp}", "extractor.templates_file: templates file /tmp is a folder"),
])
def test_edges_are_refused_in_one_line_naming_the_field(text, says):
    with pytest.raises(ConfigError) as e:
        load_run_config(text + "\n")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_config_path_that_is_a_folder_or_missing_is_named(tmp_path):
    with pytest.raises(ConfigError, match="is a folder; give a YAML config file"):
        load_run_config(str(tmp_path))
    with pytest.raises(ConfigError, match="is a folder"):
        load_run_config(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(str(tmp_path / "nope.yaml"))
    ok = tmp_path / "t.yaml"
    ok.write_text("extractor: {templates_file: " + str(tmp_path / "tpl.yaml") + "}\n")
    (tmp_path / "tpl.yaml").write_text("no_such_template: x\n")
    with pytest.raises(ConfigError, match="unknown template 'no_such_template'"):
        load_run_config(ok)


def test_the_ab_tab_defaults_match_the_default_run():
    """The A/B tab opens on the default run's env, its recurring task ids and its turn limit: a library is tested
    on the tasks and under the limit it was written for."""
    from app.ui import AB_ENV, AB_MAX_TURNS

    cfg = load_run_config(shipped_configs()["minihack_room_cpu"])
    assert list(cfg.env.names) == [AB_ENV] and cfg.env.max_turns == AB_MAX_TURNS and cfg.env.task_set == 16


def test_a_run_that_differs_from_the_embedded_build_is_told_where():
    """The settings that shape an embedded model's prompts live in the run config and in WarmStartConfig: the
    default config matches the default build field for field, and a run that differs gets one line per field."""
    import dataclasses

    from trainers.config import embedded_build_mismatches
    from trainers.warmstart import WarmStartConfig

    built = dataclasses.asdict(WarmStartConfig())
    default = shipped_configs()["minihack_room_cpu"]
    cfg = load_run_config(default)
    assert embedded_build_mismatches(cfg, built) == []
    other = load_run_config(default, overrides={
        "env": {"max_turns": 20, "names": {"minihack/Room-Ultimate-5x5": 0.5, "alfworld/pick_and_place": 0.5}},
        "rollout": {"history_turns": 2, "search_and_ask": 1}, "extractor": {"op_budget": 5}})
    lines = embedded_build_mismatches(other, built)
    assert len(lines) == 5, lines  # history_chars and trajectory_chars still agree
    assert any(l.startswith("env.max_turns is 20 but the embedded models were built with max_turns 8") for l in lines)
    assert any("rollout.history_turns is 2" in l for l in lines) and not any("history_chars" in l for l in lines)
    assert any("alfworld/pick_and_place" in l and "--envs" in l for l in lines)
    assert any("extractor.op_budget is 5" in l for l in lines) and any("allow_tool False" in l for l in lines)
    mine = load_run_config(default, overrides={"actor": {"path": "/my/model"}, "rollout": {"history_turns": 2}})
    assert embedded_build_mismatches(mine, built) == []  # a user's own models: nothing to compare


def test_the_run_and_the_embedded_build_read_their_prompt_defaults_from_one_place():
    """trainers/config.py PROMPT_DEFAULTS is the one definition of the prompt shape a run shares with the embedded
    build: the run's defaults and WarmStartConfig's are its values (a run on the build's envs and turn limit, all else
    left alone, is told of no difference), and the default build's digest is still the one existing builds carry."""
    import dataclasses

    from trainers.config import PROMPT_DEFAULTS as P, embedded_build_mismatches
    from trainers.warmstart import WarmStartConfig

    ws = WarmStartConfig()
    cfg = load_run_config({"env": {"names": {e: 1.0 for e in ws.envs}, "max_turns": ws.max_turns}})
    assert embedded_build_mismatches(cfg, dataclasses.asdict(ws)) == []
    r, x = cfg.rollout, cfg.extractor
    assert (r.history_turns, r.history_chars, r.search_and_ask, x.trajectory_chars, x.op_budget) == (
        P.history_turns, P.history_chars, P.search_and_ask, P.trajectory_chars, P.op_budget)
    assert (ws.history_turns, ws.history_chars, ws.allow_tool, ws.trajectory_chars, ws.op_budget) == (
        P.history_turns, P.history_chars, P.search_and_ask > 0, P.trajectory_chars, P.op_budget)
    assert ws.digest() == "4f1ed34d3539988c"  # how the build marker hashes the config: existing builds stay valid
