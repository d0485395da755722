"""Input mutations by class, counted: each is either refused (a one-line error naming what to fix, exit 2 where a
command, nothing written) or, where the input is valid after all, taken exactly. Every test prints its figure
("<class> mutations handled X/Y") for experiments/reliability.py, and asserts X == Y.

Classes: a library file for `comprl library import` (both back ends), a run config, the store's boundary (both back
ends), env actions, model answers. The workbench's malformed ids/versions/counts are counted in test_service.py."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import random
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.both_backends
ROOT = Path(__file__).resolve().parents[1]


def _report(name: str, outcomes: list[tuple[str, bool, str]]) -> None:
    """outcomes: (kind, handled, detail). Prints the figure with a per-kind breakdown and every miss."""
    kinds: dict[str, list[int]] = {}
    for kind, ok, _ in outcomes:
        k = kinds.setdefault(kind, [0, 0])
        k[0] += ok
        k[1] += 1
    handled = sum(ok for _, ok, _ in outcomes)
    by_kind = ", ".join(f"{k} {h}/{t}" for k, (h, t) in sorted(kinds.items()))
    print(f"\n{name} mutations handled {handled}/{len(outcomes)} ({by_kind})")
    for kind, ok, detail in outcomes:
        if not ok:
            print(f"  not handled: {kind}: {detail[:200]}")
    assert handled == len(outcomes)


# -- a library file --------------------------------------------------------------------------------------------

def _cli(*args: str) -> tuple[int, str]:
    from app.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(list(args))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
    return rc, err.getvalue()


def _import_mutations(rng: random.Random, line: dict) -> list[tuple[str, str, str | bytes]]:
    """(kind, expected "refuse" | "accept", the line) for one exported record."""
    out: list[tuple[str, str, str | bytes]] = []

    def with_(path: tuple[str, ...], value) -> str:
        rec = copy.deepcopy(line)
        d = rec
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        return json.dumps(rec, ensure_ascii=False)

    for field in (("id",), ("created_step",), ("counters", "successes"), ("counters", "retrieved_count")):
        for v in (2**64, 2**63, -(2**70), 10**30, 2**31, "12", 1.5, None, [1], True):
            out.append(("integers", "refuse", with_(field, v)))
    for v in ({"prompt": 1}, {"prompt_ids": "abc"}, {"prompt_ids": [1, "x"]}, {"response_logprobs": ["a"]},
              {"prompt_ids": [2**64]}, {"response_ids": [-1]}, [1, 2], "text", {"model_version": [1]}):
        gen = dict(line.get("generation") or {"prompt": "p", "response": "r", "prompt_ids": [], "response_ids": [],
                                               "response_logprobs": [], "model_version": 0})
        gen.update(v) if isinstance(v, dict) else None
        out.append(("nested types", "refuse", with_(("generation",), gen if isinstance(v, dict) else v)))
    for v in (None, 5, ["x"], "", "x" * 4001, "a\x00b"):
        out.append(("text field", "refuse", with_(("text",), v)))
    for v in ("e" * 129, None, 7):
        out.append(("env field", "refuse", with_(("env",), v)))
    for v in ("sideways", 3):
        out.append(("enums", "refuse", with_(("status",), v)))
    good = json.dumps(line, ensure_ascii=False)
    for cut in sorted(rng.sample(range(1, len(good) - 1), 8)):
        out.append(("truncated JSON", "refuse", good[:cut]))
    raw = good.encode()
    for _ in range(6):
        at = rng.randrange(len(raw))
        out.append(("invalid UTF-8", "refuse", raw[:at] + bytes([rng.choice([0x80, 0xC3, 0xFF, 0xFE])]) + raw[at + 1:]))
    out.append(("not an object", "refuse", "[1, 2, 3]"))
    out.append(("not an object", "refuse", '"just a string"'))
    out.append(("missing fields", "refuse", json.dumps({k: v for k, v in line.items() if k != "text"})))
    # valid after all: texts with characters that break naive line handling; they must arrive exactly
    for ch in ("\u2028", "\u2029", "\u0085", "\r", "\x1e", "\ufeff", "\U0001F600", "\u202e", "\\n", "\t"):
        out.append(("odd characters (valid)", "accept", with_(("text",), f"before{ch}after {rng.random()}")))
    return out


@pytest.mark.slow
def test_library_import_mutations(new_db_url, tmp_path):
    from core.store import ExperienceStore

    rng = random.Random(26)
    src = ExperienceStore(new_db_url())
    src.add_entry("walk south twice, then east: the stairs are there", env="minihack/Room-5x5", task="reach the stairs")
    export = tmp_path / "lib.jsonl"
    assert _cli("library", "export", str(export), "--db", src.url, "--data-dir", str(tmp_path))[0] == 0
    line = json.loads(export.read_text().splitlines()[0])
    dest_url = new_db_url()
    dest = ExperienceStore(dest_url)
    outcomes = []
    for n, (kind, expect, text) in enumerate(_import_mutations(rng, line)):
        f = tmp_path / f"m{n}.jsonl"
        f.write_bytes(text if isinstance(text, bytes) else (text + "\n").encode())
        before = (dest.count(status=None), dest.library_version())
        rc, err = _cli("library", "import", str(f), "--fresh-ids", "--db", dest_url, "--data-dir", str(tmp_path))
        after = (dest.count(status=None), dest.library_version())
        if expect == "refuse":
            ok = rc == 2 and err.startswith("comprl: error:") and err.count("\n") == 1 and after == before
        else:
            want = json.loads(text)["text"]
            got = [e.text for e in dest.list_entries(status=None, limit=10**6).entries]
            ok = rc == 0 and after[0] == before[0] + 1 and want in got
            # and it goes out and comes back the same
            again = tmp_path / f"again{n}.jsonl"
            ok = ok and _cli("library", "export", str(again), "--db", dest_url, "--data-dir", str(tmp_path))[0] == 0
            ok = ok and want in [json.loads(x)["text"] for x in again.read_text(encoding="utf-8").split("\n") if x]
        outcomes.append((kind, ok, f"rc {rc} store {before}->{after}: {err.strip()[:150]}"))
    _report(f"library import ({dest_url.split(':')[0].split('+')[0]})", outcomes)


# -- a run config ----------------------------------------------------------------------------------------------

def _config_mutations(base: dict) -> list[tuple[str, str]]:
    """(kind, YAML text), every one invalid."""
    def leaves(d, path=()):
        for k, v in d.items():
            if isinstance(v, dict) and k != "names":
                yield from leaves(v, path + (k,))
            else:
                yield path + (k,), v

    def with_(path, value) -> str:
        d = copy.deepcopy(base)
        t = d
        for k in path[:-1]:
            t = t[k]
        t[path[-1]] = value
        return yaml.safe_dump(d)

    out = []
    for path, v in leaves(base):
        if isinstance(v, bool):
            muts = [("wrong type", "maybe"), ("wrong type", 3)]
        elif isinstance(v, int):
            muts = [("wrong type", "abc"), ("wrong type", [1, 2]), ("out of range", 2**64), ("out of range", 2**31),
                    ("wrong type", 1.5)]
        elif isinstance(v, float):
            muts = [("wrong type", "abc"), ("not finite", float("nan")), ("not finite", float("inf"))]
        elif isinstance(v, str):
            muts = [("wrong type", 12345), ("wrong type", ["x"]), ("wrong type", {"a": 1})]
        else:
            muts = [("wrong type", "abc")]
        out += [(kind, with_(path, m)) for kind, m in muts]
    for section in base:
        out.append(("unknown field", with_((section, "no_such_field"), 1)))
    text = yaml.safe_dump(base)
    for section in base:
        out.append(("duplicate key", text + f"{section}: {{}}\n"))
    for path, v in (
        (("run", "max_steps"), -5), (("run", "max_steps"), 0), (("env", "max_turns"), -5), (("actor", "temperature"), -1.0),
        (("rollout", "group_size"), 0), (("rollout", "tasks_per_step"), -1), (("run", "variant"), "greedy"),
        (("env", "names"), {"minihack/No-Such-Env": 1.0}), (("env", "names"), {}), (("env", "names"), {"webshop": -1}),
        (("actor", "lr"), -1e-4), (("run", "eval_every"), -1),
    ):
        out.append(("bad value", with_(path, v)))
    out.append(("broken YAML", text.replace(":", "", 1)))
    out.append(("broken YAML", "run: {max_steps: 3\n"))
    out.append(("broken YAML", "- a list\n- not sections\n"))
    return out


def test_config_mutations(tmp_path):
    from core.config import ConfigError
    from trainers.config import load_run_config

    base = yaml.safe_load((ROOT / "configs" / "minihack_room_cpu.yaml").read_text())
    outcomes = []
    for n, (kind, text) in enumerate(_config_mutations(base)):
        path = tmp_path / f"c{n}.yaml"
        path.write_text(text)
        try:
            load_run_config(path)
            outcomes.append((kind, False, f"accepted: {text[:150]!r}"))
        except ConfigError as e:
            outcomes.append((kind, "\n" not in str(e), str(e)))
        except Exception as e:  # noqa: BLE001 - a traceback is what this counts
            outcomes.append((kind, False, f"{type(e).__name__}: {e}"))
    # paths that are not config files, through the command a user runs (exit 2, one line)
    for kind, path in (("config path", tmp_path / "missing.yaml"), ("config path", tmp_path),
                       ("templates_file", None)):
        if path is None:
            p = tmp_path / "t.yaml"
            p.write_text(yaml.safe_dump(base | {"rollout": dict(base["rollout"], templates_file=str(tmp_path / "no.py"))}))
            path = p
        rc, err = _cli("train", str(path), "--data-dir", str(tmp_path / "d"), "--db", f"sqlite:///{tmp_path / 'x.db'}")
        outcomes.append((kind, rc == 2 and err.startswith("comprl: error:") and err.count("\n") == 1, err.strip()))
    _report("config", outcomes)


# -- the store's boundary --------------------------------------------------------------------------------------

def test_store_boundary_mutations(store):
    from core.store import StoreError

    run = store.create_run("r")
    eid = store.add_entry("an entry", env="e", task="t")
    calls = [
        ("NUL character", lambda: store.add_entry("a\x00b", env="e")),
        ("NUL character", lambda: store.add_entry("ok", env="e\x00")),
        ("NUL character", lambda: store.create_run("r\x00")),
        ("NUL character", lambda: store.update_text(eid, "x\x00", expected_version=1, actor="human")),
        ("long string", lambda: store.add_entry("ok", env="e" * 129)),
        ("long string", lambda: store.create_run("r" * 257)),
        ("long string", lambda: store.add_entry("ok", env="e", actor="a" * 65)),
        ("integer range", lambda: store.log_metrics(run, 2**31, {"a": 1.0})),
        ("integer range", lambda: store.log_metrics(2**63, 1, {"a": 1.0})),
        ("integer range", lambda: store.get(2**63)),
        ("integer range", lambda: store.get_run(-(2**63))),
        ("integer range", lambda: store.update_run(run, step=2**40)),
        ("integer range", lambda: store.add_entry("ok", env="e", created_step=2**31)),
        ("integer range", lambda: store.record_outcomes([(eid, True, 1.0)], run_id=run, step=2**31)),
        ("not a number", lambda: store.add_trajectories([{"run_id": run, "step": 1, "env": "e", "task": "t",
                                                          "reward": float("nan")}])),
        ("stale version", lambda: store.update_text(eid, "new", expected_version=7, actor="human")),
        ("unknown field", lambda: store.update_run(run, no_such_column=1)),
    ]
    snapshot = lambda: (store.count(status=None), store.library_version(), store.get(eid).text,  # noqa: E731
                        store.get_run(run)["step"], len(store.metrics_since(run)),
                        len(store.list_trajectories(run_id=run)), len(store.usage(eid)))
    outcomes = []
    for kind, call in calls:
        before = snapshot()
        try:
            call()
            outcomes.append((kind, False, "accepted"))
        except StoreError as e:
            outcomes.append((kind, "\n" not in str(e) and snapshot() == before, str(e)))
        except Exception as e:  # noqa: BLE001 - a driver error is what this counts (it differed by back end)
            outcomes.append((kind, False, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
    _report(f"store boundary ({store.url.split(':')[0].split('+')[0]})", outcomes)


# -- env actions and model answers -----------------------------------------------------------------------------

def _random_texts(rng: random.Random, n: int) -> list[str]:
    alphabet = "abc xyz<>{}[]\"':;,.0123456789\n\t\\/\x00\u2028\U0001F600éλ$`|&*()-+=#"
    out = ["", " ", "\n" * 50, "x" * 100_000, "9" * 400, "{" * 5000, "<answer>" * 100, "\x00", "submit\nsubmit"]
    while len(out) < n:
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))))
    return out


def test_env_action_mutations():
    from envs.registry import make_env

    rng = random.Random(26)
    outcomes = []
    for name in ("minihack/Room-5x5", "alfworld/pick_and_place", "webshop", "swe/local"):
        env = make_env(name)
        try:
            env.reset(seed=0)
            for text in _random_texts(rng, 40):
                try:
                    obs, reward, term, trunc, info = env.step(text)
                    ok = isinstance(obs, str) and ("invalid_action" in info)
                    outcomes.append((name, ok, repr(text)[:60]))
                    if term or trunc:
                        env.reset(seed=rng.randrange(100))
                except Exception as e:  # noqa: BLE001 - an exception out of step is what this counts
                    outcomes.append((name, False, f"{repr(text)[:60]}: {type(e).__name__}: {e}"))
                    env.reset(seed=0)
        finally:
            env.close()
    _report("env action", outcomes)


def test_model_answer_mutations():
    from core.types import Experience
    from trainers.parsing import parse_action, parse_extraction, parse_merge_answer, parse_rewrite

    rng = random.Random(26)
    texts = _random_texts(rng, 150) + [
        '<answer>[{"function_name": "update", "parameters": {"idx": 99999999999999999999999, "memory": "x"}}]</answer>',
        '<answer>' + "[" * 10_000 + '</answer>', '<answer>[{"op": "add", "text": null}]</answer>',
        '<answer>{"idx": true}</answer>', '<answer>[{"function_name": "delete", "parameters": {"idx": -1}}]</answer>',
    ]
    chunk = [Experience(id=1, text="a"), Experience(id=2, text="b")]
    outcomes = []
    for text in texts:
        for name, fn in (("extraction", lambda t: parse_extraction(t, [1, 2])), ("merge", lambda t: parse_merge_answer(t, chunk)),
                         ("rewrite", parse_rewrite), ("action", lambda t: parse_action(t, ["north", "south"]))):
            try:
                fn(text)
                outcomes.append((name, True, ""))
            except Exception as e:  # noqa: BLE001 - the parsers never raise
                outcomes.append((name, False, f"{repr(text)[:60]}: {type(e).__name__}: {e}"))
    _report("model answer", outcomes)
