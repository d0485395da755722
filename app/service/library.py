"""The experience library as the workbench shows it: the table and semantic search, one entry (edit, archive,
diff, revert, create), merges by hand, duplicate clusters, import and export."""
from __future__ import annotations

import importlib
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from app import views
from app.service.common import _cosine, ENV_LOCK, _err, _ok, parse_ids, UserInputError, whole_number
from core import library_io, merge
from core.library_io import MAX_ENTRY_CHARS
from core.store import INT32, NewEntry, StaleWriteError, StoreError, text_diff
from core.types import Experience, Source, Status, format_entry_text
from envs.base import task_id_of
from envs.entry_check import EntryChecker

class LibraryPart:
    """The Workbench's library methods (app/service/__init__.py composes the Workbench from these parts; its state
    is set up in Workbench.__init__)."""

    def library_facets(self) -> dict[str, list[str]]:
        return self.store.entry_facets()

    def library_page(self, env: str | None = None, source: str | None = None, status: str | None = "active",
                     text: str | None = None, sort: str = "id", descending: bool = False, page: Any = 1,
                     page_size: Any = 50) -> tuple[pd.DataFrame, str]:
        try:
            page = max(1, int(page or 1))
            page_size = min(500, max(1, int(page_size or 50)))
        except (TypeError, ValueError):
            return views.entries_table([]), _err("page and page size must be whole numbers")
        status_arg = None if status in (None, "", "all") else status
        try:
            p = self.store.list_entries(env=env or None, source=source or None, status=status_arg, text=(text or "").strip() or None,
                                        sort=sort or "id", descending=bool(descending), offset=(page - 1) * page_size,
                                        limit=page_size)
        except (StoreError, ValueError) as e:
            return views.entries_table([]), _err(str(e))
        return (views.entries_table(p.entries, verdicts=self.verdicts(p.entries)),
                views.page_info(p.offset, len(p.entries), p.total, page, page_size))

    def verdicts(self, entries: Sequence[Experience]) -> list[str]:
        """Per entry, whether its claim about its task's level is right (envs/entry_check.py); "unknown" where the
        task is not a recurring one of an env with a checker. Each level is learned once per workbench, by the
        scripted expert playing it in a real env: under ENV_LOCK (app/service/common.py), like every env here."""
        checkable = [task_id_of(e.task) is not None and EntryChecker.supports(e.env) for e in entries]
        if not any(checkable):
            return ["unknown"] * len(entries)
        out = []
        with ENV_LOCK:
            if self._checker is None:
                self._checker = EntryChecker()
            for e, ok in zip(entries, checkable):
                try:
                    out.append(self._checker.verdict(e.env, e.task, e.text) if ok else "unknown")
                except Exception:  # an env that cannot be built here: nothing to say, never a broken table
                    out.append("unknown")
        return out

    def semantic_search(self, query: str, env: str | None = None, k: Any = 20) -> tuple[pd.DataFrame, str]:
        if not (query or "").strip():
            return views.entries_table([], scores=[]), "type a query to search by meaning"
        try:
            k = min(200, whole_number(k or 20, "the number of results", lo=1, hi=INT32[1]))
        except UserInputError as e:
            return views.entries_table([], scores=[]), _err(str(e))
        with self.searching() as m:
            # By the entry's own text (its title, description and content), not its task key: every entry of one
            # task has the same key, so a search by key ties them all. The key's score is shown beside it.
            ids, vecs, entries = self.store.active_vectors("text")
            if env:
                keep = np.array([e.env == env for e in entries], dtype=bool)
                ids, vecs, entries = ids[keep], vecs[keep], [e for e, k in zip(entries, keep) if k]
            if not len(ids):
                return views.entries_table([], scores=[]), "no active entry to search" + (f" in env {env}" if env else "")
            qv = np.asarray(m.embedder.embed_queries([query])[0], dtype=np.float32)
        scores = _cosine(vecs, qv)
        order = np.argsort(-scores, kind="stable")[:k]
        keyvecs = self.store.embeddings([int(ids[i]) for i in order], key="query")
        found = [entries[i] for i in order]
        task_scores = [float(_cosine(keyvecs[e.id][None, :], qv)[0]) if e.id in keyvecs else float("nan") for e in found]
        return (views.entries_table(found, scores=[float(scores[i]) for i in order], verdicts=self.verdicts(found),
                                    task_scores=task_scores),
                f"{len(found)} entries whose text is closest in meaning to {query!r}" + (f" in env {env}" if env else "") +
                " (score: the entry's text; task score: its task key, which every entry of a task shares)")

    def _entry_id(self, entry_id: Any) -> int:
        if entry_id in (None, ""):
            raise UserInputError("give an entry id (a number from the table)")
        return whole_number(entry_id, "entry id")

    def open_entry(self, entry_id: Any) -> dict[str, Any]:
        """Everything the entry panel shows; 'error' is set instead when the id is bad."""
        try:
            eid = self._entry_id(entry_id)
            e = self.store.get(eid)
        except (UserInputError, StoreError) as err:
            return {"error": _err(str(err))}
        versions = self.store.history(eid)
        parents = self.store.get_many(e.parent_ids)
        children = self.store.get_many(self.store.children(eid))
        return {
            "error": "", "id": e.id, "version": e.version, "text": e.text, "meta": views.entry_meta_md(e),
            "lineage": views.lineage_md(e, parents, children), "usage": views.usage_table(usage := self.store.usage(eid)),
            "usage_note": views.usage_note(e, len(usage)), "source_episode": e.source_episode_id,
            "history": views.history_table(versions), "versions": [v.version for v in versions], "status": e.status.value,
        }

    def save_entry(self, entry_id: Any, text: str, loaded_version: Any) -> tuple[str, int | None]:
        """(message, the version now loaded). A stale edit is refused and the person's text is kept in the
        editor (the UI does not touch it), with a diff against the current text to reapply it."""
        try:
            eid = self._entry_id(entry_id)
            expected = whole_number(loaded_version, "the loaded version")
        except UserInputError as e:
            return _err(f"open an entry before editing it ({e})"), None
        if not (text or "").strip():
            return _err("the text is empty; an entry needs a text (archive it to remove it)"), expected
        if len(text) > MAX_ENTRY_CHARS:
            # the import cap: an entry longer than this could be exported but never imported again
            return _err(f"the text is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,} "
                        "(shorten it, or split it into two entries). Not saved."), expected
        try:
            e = self.store.update_text(eid, text, expected_version=expected, actor="human")
        except StaleWriteError as err:
            current = self.store.get(eid)
            d = self.store.diff(eid, expected, current.version) if expected in [v.version for v in self.store.history(eid)] else ""
            return (_err(f"{err}. Your text is still in the editor, not saved. What changed meanwhile:") +
                    f"\n\n```diff\n{d or '(status change only)'}\n```"), expected
        except StoreError as err:
            return _err(str(err)), expected
        return _ok(f"saved entry {eid} as version {e.version}; a running trainer picks it up within seconds"), e.version

    def set_entry_status(self, entry_id: Any, loaded_version: Any, status: str) -> tuple[str, int | None]:
        try:
            eid = self._entry_id(entry_id)
            expected = whole_number(loaded_version, "the loaded version")
        except UserInputError as e:
            return _err(f"open an entry first ({e})"), None
        try:
            changed = self.store.set_status([eid], Status(status), actor="human", expected_versions={eid: expected})
        except StoreError as err:
            return _err(str(err)), expected
        now = self.store.get(eid).version
        verb = "archived" if status == "archived" else "restored"
        return (_ok(f"{verb} entry {eid} (version {now})") if changed else f"entry {eid} was already {status}"), now

    def diff_versions(self, entry_id: Any, v_from: Any, v_to: Any) -> str:
        try:
            eid = self._entry_id(entry_id)
            return views.diff_html(self.store.diff(eid, whole_number(v_from, "version"), whole_number(v_to, "version")))
        except UserInputError as e:
            return views.diff_html("", f"choose an entry and two versions ({e})")
        except StoreError as err:
            return views.diff_html("", str(err))

    def revert_entry(self, entry_id: Any, to_version: Any, loaded_version: Any) -> tuple[str, int | None]:
        try:
            eid = self._entry_id(entry_id)
            expected, to_v = whole_number(loaded_version, "the loaded version"), whole_number(to_version, "version")
        except UserInputError as e:
            return _err(f"open an entry and choose the version to revert to ({e})"), None
        try:
            e = self.store.revert(eid, to_v, expected_version=expected, actor="human")
        except StoreError as err:
            return _err(str(err)), expected
        return _ok(f"entry {eid} has the text of v{to_v} again, as version {e.version}"), e.version

    def create_entry(self, title: str, description: str, content: str, env: str = "", task: str = "") -> tuple[str, int | None]:
        if not (title or "").strip() or not (content or "").strip():
            return _err("a new entry needs at least a title and a content"), None
        text = format_entry_text(title, description or "", content)
        if len(text) > MAX_ENTRY_CHARS:
            return _err(f"the entry is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,}. Not saved."), None
        try:
            eid = self.store.add_entries([NewEntry(text=text, env=(env or "").strip(), task=(task or "").strip(),
                                                   query=(task or "").strip(), source=Source.MANUAL)],
                                         actor="human", note="written in the workbench")[0]
        except StoreError as e:
            return _err(str(e)), None
        return _ok(f"created entry {eid} (source manual); it is embedded and searchable within seconds"), eid

    def _merge_parents(self, ids_text: Any) -> list[Experience]:
        ids = parse_ids(ids_text)
        if len(ids) < 2:
            raise UserInputError("a merge needs at least two entry ids")
        found = self.store.get_many(ids)
        missing = [i for i in ids if i not in found]
        if missing:
            raise UserInputError(f"no entry with id {missing[0]}")
        archived = [i for i in ids if found[i].status is not Status.ACTIVE]
        if archived:
            raise UserInputError(f"entry {archived[0]} is archived; restore it before merging it")
        return [found[i] for i in ids]

    def propose_merge(self, ids_text: Any) -> tuple[str, str]:
        """(proposed merged text, note). The extractor proposes through the trainer's
        `trainers.extractor.propose_merge(store, ids, data_dir=...) -> str`; when that is missing or
        fails, the parents' texts come back joined, for the person to edit, and the note says so."""
        try:
            parents = self._merge_parents(ids_text)
        except UserInputError as e:
            return "", _err(str(e))
        try:
            extractor = importlib.import_module("trainers.extractor")
            propose = getattr(extractor, "propose_merge")
        except Exception as e:
            joined = "\n\n".join(p.text for p in parents)
            return joined, (f"No extractor proposal here ({type(e).__name__}: {e}): these are the {len(parents)} parents' "
                            "texts joined — edit them into one entry, then preview and accept.")
        try:
            text = propose(self.store, [p.id for p in parents], data_dir=str(self.data_dir))
        except Exception as e:  # the extractor's failure must not lose the person's work
            return "\n\n".join(p.text for p in parents), (f"The extractor gave no proposal ({type(e).__name__}: {e}): "
                                                           "the parents' texts are joined below — edit them into one entry.")
        return str(text), "Proposed by the extractor; edit as you like, then preview and accept."

    def merge_preview(self, ids_text: Any, text: str) -> str:
        try:
            parents = self._merge_parents(ids_text)
        except UserInputError as e:
            return views.diff_html("", str(e))
        out = []
        for p in parents:
            d = text_diff(p.text, text or "", f"#{p.id} v{p.version}", "merged")
            out.append(f"<div class='turn-head'>#{p.id} → merged</div>" + views.diff_html(d))
        return "".join(out)

    def accept_merge(self, ids_text: Any, text: str) -> tuple[str, int | None]:
        try:
            parents = self._merge_parents(ids_text)
        except UserInputError as e:
            return _err(str(e)), None
        if not (text or "").strip():
            return _err("write the merged text first (or get a proposal)"), None
        if len(text) > MAX_ENTRY_CHARS:
            return _err(f"the merged text is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,}"), None
        try:
            nid = merge.merge_entries(self.store, [p.id for p in parents], text, actor="human",
                                      expected_versions={p.id: p.version for p in parents})
        except StoreError as e:
            return _err(str(e)), None
        return _ok(f"merged {', '.join(f'#{p.id}' for p in parents)} into entry {nid}; the parents are archived "
                   f"(undo restores them)"), nid

    def undo_merge(self, merged_id: Any) -> str:
        try:
            mid = self._entry_id(merged_id)
            parents = merge.undo_merge(self.store, mid, actor="human")
        except (UserInputError, StoreError) as e:
            return _err(str(e))
        return _ok(f"undid merge {mid}: it is archived and {', '.join(f'#{p}' for p in parents)} are active again")

    def duplicate_clusters(self, threshold: Any = 0.9, across_tasks: bool = False) -> tuple[pd.DataFrame, str]:
        try:
            th = float(threshold)
        except (TypeError, ValueError):
            return views.clusters_table([], {}), _err("the threshold is a cosine similarity, e.g. 0.9")
        if not -1.0 <= th <= 1.0:
            return views.clusters_table([], {}), _err("the threshold is a cosine similarity within [-1, 1]")
        with self.searching():  # embeds entries that have no text embedding yet
            clusters = merge.find_near_duplicates(self.store, threshold=th, across_tasks=bool(across_tasks))
        entries = self.store.get_many([i for c in clusters[:200] for i in c])
        return (views.clusters_table(clusters[:200], entries),
                f"{len(clusters)} near-duplicate clusters at cosine ≥ {th}" + (" (first 200 shown)" if len(clusters) > 200 else ""))

    def cluster_ids(self, table: pd.DataFrame | None, row: Any) -> str:
        """The ids of one row of the near-duplicate table, for the merge box."""
        try:
            return str(table.iloc[int(row)]["ids"])
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return ""

    def import_file(self, path: str | None, fresh_ids: bool = True) -> str:
        if not path:
            return _err("choose a JSONL file to import")
        p = Path(path)
        if not p.is_file():
            return _err(f"the uploaded file {p.name} is gone; upload it again")
        size = p.stat().st_size
        if size > self.upload_cap_bytes:
            return _err(f"{p.name} is {views.fmt_bytes(size)}, over the upload cap of {views.fmt_bytes(self.upload_cap_bytes)}; "
                        "split it or import it with `comprl library import`")
        try:
            rep = library_io.import_library(self.store, p, keep_ids=not fresh_ids)
        except library_io.LibraryFileError as e:
            msg = str(e).replace(str(p), p.name)
            return _err(msg)
        return _ok(f"imported {rep.imported} entries (library version {self.store.library_version()})")

    def export_library(self, status: str | None = None) -> tuple[str | None, str]:
        status = None if status in (None, "", "all") else status
        path = self.data_dir / "exports" / f"library-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}.jsonl"
        n = library_io.export_library(self.store, path, status=status)
        return str(path), _ok(f"exported {n} entries")
