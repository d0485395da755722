"""`comprl library …` as a new user runs it: a real process, a real data directory."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def comprl(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "app.cli", *args, "--data-dir", str(data_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "app.cli", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "library" in out.stdout


@pytest.mark.slow
def test_library_import_stats_search_export_edit(tmp_path):
    data = tmp_path / "data"
    src = tmp_path / "lib.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"text": "## Title: Apples\n## Description: d\n## Content: Apples are usually in the fridge.", "env": "alfworld",
         "task": "put an apple in the microwave"},
        {"text": "## Title: Stairs\n## Description: d\n## Content: Walk diagonally to the >.", "env": "minihack",
         "task": "reach the staircase down"},
    ]) + "\n")
    r = comprl("library", "import", str(src), data_dir=data)
    assert r.returncode == 0, r.stderr
    assert "imported 2 entries" in r.stdout
    assert (data / "workbench.db").exists()
    r = comprl("library", "stats", "--json", data_dir=data)
    stats = json.loads(r.stdout)
    assert stats["active"] == 2 and stats["by_env"] == {"alfworld": 1, "minihack": 1}
    r = comprl("library", "search", "where do I find an apple", "-k", "2", data_dir=data)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("#1") and "Apples" in first
    r = comprl("library", "edit", "1", "--text", "changed", "--expected-version", "1", data_dir=data)
    assert r.returncode == 0 and "version 2" in r.stdout
    r = comprl("library", "edit", "1", "--text", "stale", "--expected-version", "1", data_dir=data)
    assert r.returncode == 2 and "changed by someone else" in r.stderr
    out = tmp_path / "out.jsonl"
    r = comprl("library", "export", str(out), data_dir=data)
    assert r.returncode == 0 and len(out.read_text().splitlines()) == 2
    r = comprl("library", "diff", "1", "1", "2", data_dir=data)
    assert "+changed" in r.stdout


def test_bad_import_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": ""}\n')
    r = comprl("library", "import", str(bad), data_dir=tmp_path / "d")
    assert r.returncode == 2
    assert "line 2" in r.stderr and "nothing imported" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_models_init_set_errors_are_one_line_and_build_nothing(tmp_path):
    """`comprl models init --set …` with a bad field or value, or `--set` on `list`: exit 2 with an
    actionable message, no traceback, no models folder."""
    r = comprl("models", "init", "--set", "policy_width=256", data_dir=tmp_path)
    assert r.returncode == 2 and "unknown config field policy_width" in r.stderr and "policy_hidden" in r.stderr
    assert "Traceback" not in r.stderr
    r = comprl("models", "init", "--set", "policy_hidden=wide", data_dir=tmp_path)
    assert r.returncode == 2 and "policy_hidden = 'wide' has the wrong type" in r.stderr
    r = comprl("models", "list", "--set", "policy_hidden=256", data_dir=tmp_path)
    assert r.returncode == 2 and "apply to `comprl models init` only" in r.stderr
    assert not (tmp_path / "models").exists()


@pytest.mark.slow
def test_train_refuses_bad_configs_in_one_line_before_any_run_row(tmp_path):
    """Exit 2, one line naming the fix, and no run row (an unknown env used to start a run that "finished"
    with every episode failed)."""
    from core.store import ExperienceStore

    unknown_env = tmp_path / "unknown_env.yaml"
    unknown_env.write_text("env: {names: {minihack/Room-9x9: 1.0}}\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text("run: {max_steps: 2}\nenv: {max_turns: 3}\nrun: {seed: 4}\n")
    for args, says in [((str(unknown_env),), "env.names: unknown env 'minihack/Room-9x9'"),
                       ((str(dup),), "line 3: key 'run' is given twice"),
                       ((str(tmp_path),), "is a folder; give a YAML config file"),
                       ((str(unknown_env), "--set", "env.names={minihack/Room-5x5: 1}", "--set", "actor.temperature=-1"),
                        "actor.temperature must be >= 0")]:
        r = comprl("train", *args, data_dir=tmp_path / "d")
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [r.stderr.strip()] and says in r.stderr, r.stderr
    db = tmp_path / "d" / "workbench.db"
    assert not db.exists() or ExperienceStore(f"sqlite:///{db}").list_runs() == []


@pytest.mark.slow
def test_library_commands_refuse_huge_ids_and_oversized_edits_in_one_line(tmp_path):
    data = tmp_path / "d"
    src = tmp_path / "lib.jsonl"
    src.write_text('{"text": "one"}\n')
    assert comprl("library", "import", str(src), data_dir=data).returncode == 0
    for args, says in [(("library", "show", str(2**63)), "out of range"),
                       (("library", "edit", "1", "--text", "x" * 4001, "--expected-version", "1"), "at most 4,000"),
                       (("library", "edit", "1", "--text", "y", "--expected-version", str(2**64)), "out of range"),
                       (("library", "archive", str(2**31)), "out of range")]:
        r = comprl(*args, data_dir=data)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = comprl("library", "show", "1", data_dir=data)
    assert r.returncode == 0 and r.stdout.startswith("#1 v1 active")  # unchanged by the refused commands


@pytest.mark.slow
def test_small_things_a_new_user_meets(tmp_path):
    """`library stats` ranks no "most retrieved" list of zeros; `eval --checkpoint` of a missing folder says so (not
    "run models init"); a broken JSON line's error has one "at"."""
    data = tmp_path / "data"
    src = tmp_path / "lib.jsonl"
    src.write_text(json.dumps({"text": "## Title: A\n## Description: d\n## Content: c", "env": "minihack"}) + "\n")
    assert comprl("library", "import", str(src), data_dir=data).returncode == 0
    r = comprl("library", "stats", data_dir=data)
    assert "none retrieved yet" in r.stdout and "  #1 " not in r.stdout
    r = comprl("eval", "1", "--checkpoint", "/nonexistent", data_dir=data)
    assert r.returncode == 2 and "/nonexistent does not exist" in r.stderr and "models init" not in r.stderr, r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "abc\n')
    r = comprl("library", "import", str(bad), data_dir=data)
    assert "Unterminated string starting at column" in r.stderr and "at at" not in r.stderr


@pytest.mark.slow
def test_an_ab_test_with_sampled_episodes_per_task_runs_and_pairs_them(tmp_path):
    """`comprl eval --ab-test ID` end to end on a real (untrained, tiny) policy and a real MiniHack pool: 2 task ids x
    3 sampled episodes per arm, stored and paired episode by episode; a task's repeats are not replays."""
    from core.store import ExperienceStore
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    tok = build_tokenizer(["north south east west northeast northwest southeast southwest the stairs > @ ."] * 40, vocab_size=400)
    model = save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, max_pos=2048), tok, tmp_path / "m")
    data = tmp_path / "data"
    data.mkdir()
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    store.add_entry("## Title: Stairs\n## Description: d\n## Content: the staircase is 2 south of the start", env="minihack/Room-Ultimate-5x5",
                    task="Dungeon 0: Reach the staircase")
    ab = store.create_ab_test("cli", {"env": "minihack/Room-Ultimate-5x5", "seeds": [0, 1], "checkpoint": str(model), "max_turns": 2,
                                      "task_ids": True, "episodes_per_task": 3, "decoding": "sampled",
                                      "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}})
    out = comprl("eval", "--ab-test", str(ab), data_dir=data)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "on 6 pairs (a task's k-th sampled episode in each arm)" in out.stdout
    t = store.get_ab_test(ab)
    assert t["status"] == "done" and t["results"]["arms"]["A"]["n"] == t["results"]["arms"]["B"]["n"] == 6
    eps = sorted(store.list_trajectories(ab_test_id=ab, limit=20), key=lambda e: e["id"])
    assert [e["with_experience"] for e in eps] == [True] * 6 + [False] * 6
    actions = [tuple(s["action"] for s in store.get_trajectory(e["id"])["steps"]) for e in eps[:6]]
    assert len(set(actions)) > 2  # six sampled episodes of two tasks, not two episodes replayed three times
    store.close()


# -- --data-dir and --db mean the same wherever they stand ----------------------------------------------------------


def _commands() -> list[list[str]]:
    """Every command path with the least arguments its parser accepts, read off the parser itself (so an action
    added later is covered): ["library", "show", "1"], ["eval", "1"], ["models", "list"], …"""
    from app.cli import build_parser

    def fill(parser) -> list[str]:
        out: list[str] = []
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction) or a.dest == "help":
                continue
            if not a.option_strings and a.nargs != "?":
                out.append(a.choices[-1] if a.choices else "1")
            elif a.option_strings and a.required:
                out += [a.option_strings[0], "1"]
        return out

    paths: list[list[str]] = []
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in top.choices.items():
        nested = [a for a in sp._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            paths += [[name, action, *fill(asp)] for action, asp in nested[0].choices.items()]
        else:
            paths.append([name, *fill(sp)])
    return paths


COMMANDS = _commands()


def test_every_command_is_covered():
    groups = {c[0] for c in COMMANDS}
    assert {"library", "models", "eval", "train", "envs", "app"} <= groups
    assert {c[1] for c in COMMANDS if c[0] == "library"} >= {"stats", "list", "show", "search", "edit", "merge"}


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: "_".join(c[:2]))
def test_data_dir_and_db_hold_before_and_after_the_action(cmd, tmp_path):
    """`comprl library --data-dir D stats` used to report the default ./comprl_data: the action's own default
    overrode the group's value. Every position of --data-dir / --db now means the same; none given, the defaults."""
    from app.cli import build_parser
    from core.config import DEFAULT_DATA_DIR

    d, db = str(tmp_path / "d"), f"sqlite:///{tmp_path / 'x.db'}"
    group, rest = cmd[:1], cmd[1:]
    if cmd[0] == "library":
        group, rest = cmd[:2], cmd[2:]
    orders = [["--data-dir", d, "--db", db, *cmd],                       # before the command
              [cmd[0], "--data-dir", d, "--db", db, *cmd[1:]],           # after the group, before the action
              [*group, "--data-dir", d, *rest, "--db", db],              # mixed: after the action
              [*cmd, "--db", db, "--data-dir", d]]                       # at the end
    for argv in orders:
        args = build_parser().parse_args(argv)
        assert (args.data_dir, args.db) == (d, db), argv
    args = build_parser().parse_args(cmd)
    assert args.data_dir == os.environ.get("COMPRL_DATA_DIR", DEFAULT_DATA_DIR) and args.db == os.environ.get("COMPRL_DB")


def test_library_stats_reads_the_given_data_dir_in_either_order_and_creates_no_default(tmp_path, monkeypatch, capsys):
    """The reported bug end to end (in process): both orders report the two entries of DIR, and no ./comprl_data
    appears in the working directory."""
    from app.cli import main
    from core.store import ExperienceStore

    data, cwd = tmp_path / "data", tmp_path / "cwd"
    data.mkdir()
    cwd.mkdir()
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    store.add_entry("## Title: A\n## Description: d\n## Content: a", env="minihack")
    store.add_entry("## Title: B\n## Description: d\n## Content: b", env="alfworld")
    store.close()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("COMPRL_DATA_DIR", raising=False)
    monkeypatch.delenv("COMPRL_DB", raising=False)
    for argv in (["library", "--data-dir", str(data), "stats", "--json"], ["library", "stats", "--json", "--data-dir", str(data)],
                 ["--data-dir", str(data), "library", "stats", "--json"]):
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["active"] == 2, argv
    assert main(["library", "--db", f"sqlite:///{data / 'workbench.db'}", "list"]) == 0
    assert capsys.readouterr().out.startswith("2 entries")
    assert not (cwd / "comprl_data").exists() and list(cwd.iterdir()) == []


# -- a read-only command never answers from a store it has just made ----------------------------------------------

# Every command that reads what a data directory holds: the library actions but import (the others read or change
# entries that must be there), eval (a run or an A/B test), models list, and train going on from a run.
READ_ONLY = ([c for c in COMMANDS if c[0] == "library" and c[1] != "import"] + [c for c in COMMANDS if c[0] == "eval"]
             + [["models", "list"], ["train", "--resume", "1"], ["train", "--fork", "1"]])


def test_the_read_only_list_covers_every_group_and_leaves_the_creating_commands_out():
    assert {c[0] for c in READ_ONLY} == {"library", "eval", "models", "train"}
    assert {c[1] for c in READ_ONLY if c[0] == "library"} >= {"stats", "list", "show", "search", "export", "history"}
    assert ["library", "import", "1"] not in READ_ONLY and not [c for c in READ_ONLY if c[:2] == ["models", "init"]]


@pytest.mark.parametrize("cmd", READ_ONLY, ids=lambda c: "_".join(c[:2]))
def test_a_read_only_command_on_a_missing_data_dir_is_one_line_exit_2_and_creates_nothing(cmd, tmp_path, monkeypatch, capsys):
    """`comprl library stats --data-dir TYPO` used to make TYPO/workbench.db and report an empty library."""
    from app.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPRL_DATA_DIR", raising=False)
    monkeypatch.delenv("COMPRL_DB", raising=False)
    missing = tmp_path / "typo"
    assert main([*cmd, "--data-dir", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and f"no data directory at {missing}" in err, err
    assert ("models init" if cmd[0] == "models" else "--data-dir") in err
    assert list(tmp_path.iterdir()) == []  # neither the typo nor ./comprl_data


def test_a_data_dir_without_a_store_or_a_missing_db_file_is_refused_too(tmp_path, monkeypatch, capsys):
    """A data directory that holds only models (or anything but workbench.db), or --db naming a SQLite file that is
    not there: the same one line, nothing created. `models list` reads the models only; the creating commands still
    create (library import here; train, app and models init make the folder as before)."""
    from app.cli import main

    monkeypatch.delenv("COMPRL_DB", raising=False)
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for argv in (["library", "stats"], ["eval", "1"], ["train", "--resume", "1"]):
        assert main([*argv, "--data-dir", str(data)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and f"no store at {data / 'workbench.db'}" in err, err
    other = tmp_path / "other.db"
    assert main(["library", "list", "--data-dir", str(data), "--db", f"sqlite:///{other}"]) == 2
    assert f"no store at {other}" in capsys.readouterr().err
    assert main(["library", "list", "--data-dir", str(tmp_path / "typo"), "--db", f"sqlite:///{other}"]) == 2
    assert f"no store at {other}" in capsys.readouterr().err  # with --db the folder does not matter, the file does
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"] and [p.name for p in data.iterdir()] == ["models"]
    assert main(["models", "list", "--data-dir", str(data)]) == 0 and "No models under" in capsys.readouterr().out
    src = tmp_path / "lib.jsonl"
    src.write_text(json.dumps({"text": "## Title: A\n## Description: d\n## Content: c", "env": "minihack"}) + "\n")
    fresh = tmp_path / "fresh"
    assert main(["library", "import", str(src), "--data-dir", str(fresh)]) == 0 and (fresh / "workbench.db").exists()
    assert main(["library", "stats", "--json", "--data-dir", str(fresh)]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["active"] == 1
