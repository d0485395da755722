"""The experience extractor: distillation, search-and-ask rewrites, merges, and its CISPO learner.

    loop = ExperienceLoop(cfg.extractor, cfg.library, store, manager, seed=cfg.run.seed, threads=cfg.run.threads,
                          trains=cfg.trains_extractor, deterministic=cfg.run.deterministic, data_dir=..., run_id=...)
    loop.score(episodes, step)               # credit retrieved entries with outcomes; their CISPO samples into the buffer
    loop.queue_distillation(episodes, step)  # every episode to the background distiller (a deterministic run waits)
    loop.maybe_update(step)                  # CISPO when the buffer holds extractor.buffer_size samples
    loop.merge(step)                         # periodic sliding-window merge with the extractor as merge_fn
    loop.totals()                            # running counters and the library's size, for the step's log line

Each call is one phase of the training loop (trainers/cotrain.py); score, maybe_update and merge return that
phase's metrics, and what the background distillation did shows in totals().

Distillation runs in a background thread: finished episodes enter a queue, the consumer batches
them into one generate call, parses `<think>…</think><answer>[ops]</answer>` and applies the
operations through the ExperienceManager. Rollouts never wait for it; the backlog is a metric.

Every entry the extractor writes keeps the generation that produced it (prompt, response, token
ids, log-probs). When an entry is retrieved, the outcomes of the episodes it guided become that
generation's reward (docs/method.md "Extractor objective"): ±1 averaged over the episodes, batch-mean
baseline, Eq. 7 weights looked up by entry id, CISPO loss.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from core.advantages import critic_entry_rewards, entry_rewards, experience_free_baseline, extractor_advantages, weights_for_entries
from core.config import LibraryConfig
from core.losses import cispo_loss, cispo_stats
from core.manager import ExperienceManager, OpContext
from core.merge import MergeReport, merge_walks, similarity_order, split_walks
from core.store import ExperienceStore
from core.types import Experience, Generation, Operation, Source
from trainers import prompts as P
from trainers.actor_step import reply_tensors, warmed_lr
from trainers.backends.common import checked_sync_metrics
from trainers.backends.logprobs import row_logprobs, row_logprobs_kl
from trainers.config import ExtractorSection, resolve_model_path
from trainers.models import HFBackend, LoraSettings, inference_backend, load_backend
from trainers.parsing import Parsed, parse_extraction, parse_merge, parse_merge_answer, parse_rewrite
from trainers.rollout import Episode, derive_seed


# -- the loop -----------------------------------------------------------------------------------------


def extraction_user(templates: dict[str, str], xc: ExtractorSection, task: str, success: bool,
                    steps: Sequence[tuple[str, str]], final_observation: str, previous: Sequence[str] = (),
                    num_actions: int | None = None) -> str:
    """The extraction prompt's user message for one finished episode: what a run's distillation shows the extractor
    (and the probe, trainers/probe.py). `num_actions` defaults to the steps' count (an episode's search-and-ask turns
    are steps but not actions)."""
    return templates["EXTRACTOR_USER"].format(
        task=task, outcome="success" if success else "failure", num_actions=len(steps) if num_actions is None else num_actions,
        previous=P.numbered(list(previous)),
        trajectory=P.trajectory_text(list(steps), max_chars=xc.trajectory_chars, final=final_observation),
        budget=xc.op_budget)


@dataclass
class Sample:
    """One CISPO row: an extractor generation and the reward of what it produced."""

    entry_id: int | None  # Eq. 7 keys by entry id; None for a search-and-ask rewrite
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    reward: float


class ExperienceLoop:
    def __init__(self, xc: ExtractorSection, library: LibraryConfig, store: ExperienceStore, manager: ExperienceManager, *,
                 seed: int, threads: int, trains: bool, deterministic: bool, data_dir: Path, run_id: int,
                 checkpoint: Path | None = None):
        """xc: the run's extractor section; library: its library section (the manager's text limit, merges); seed: the
        run's one seed, every sampling seed here derives from it (derive_seed); threads: torch CPU threads (0 = torch's
        default); trains: this variant trains the extractor (RunConfig.trains_extractor); deterministic: run.deterministic,
        distillation is waited for after every queued batch."""
        self.xc = xc
        self.library = library
        self.store = store
        self.manager = manager
        self.run_id = run_id
        self.seed = seed
        self.deterministic = deterministic
        self.templates = P.load_templates(self.xc.templates_file or None)
        path = str(checkpoint / "extractor") if checkpoint is not None and (checkpoint / "extractor").exists() \
            else resolve_model_path(self.xc.model.path, data_dir)
        self.trains = trains
        if self.xc.model.backend == "openai":
            # A frozen extractor on an OpenAI-compatible endpoint (RunConfig refuses it for a training variant):
            # distillation, merges and search-and-ask rewrites are generated there; no local weights are loaded.
            self.backend = None
            self.infer = inference_backend(self.xc.model, path)
        else:
            # the learner; LoRA, weight decay and the warm-up are read as for the actor (trainers/cotrain.py)
            self.backend = HFBackend(path, device=self.xc.model.device, lora=LoraSettings() if self.xc.model.lora else None,
                                     num_threads=threads or None)
            self.infer = self.backend  # what generates; vLLM when configured, synced after every update
            if self.xc.model.backend == "vllm":
                self.infer = load_backend("vllm", path)
        # extractor.kl_coef's reference: the start model (a resumed run's too, not its checkpoint), frozen
        self.reference = HFBackend(resolve_model_path(self.xc.model.path, data_dir), device=self.xc.model.device) \
            if self.trains and self.xc.kl_coef > 0 else None
        if self.reference is not None:
            self.reference.model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.backend.trainable_parameters(), lr=self.xc.model.lr,
                                           weight_decay=self.xc.model.weight_decay) if self.trains else None
        self.updates = 0  # extractor updates so far: the clock of Eq. 7's cooldown
        self.buffer: list[Sample] = []
        self.counters = {"parse_failures": 0, "distilled": 0, "adds": 0, "updates_ops": 0, "refused_ops": 0, "dropped": 0,
                         "tool_calls": 0, "tool_hits": 0, "merges": 0}
        self.last_merge: MergeReport | None = None
        # this step's credit, entry id -> (the reward its sample got, the relative reward it would have got): what
        # EntryAudit.credit_metrics checks against the entries' truth (does the reward tell a right lesson from a wrong?)
        self.last_credit: dict[int, tuple[float, float]] = {}
        self._queue: queue.Queue[tuple[Episode, int] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._worker = threading.Thread(target=self._consume, name="extractor-distil", daemon=True)
        self._worker.start()

    # -- generation --------------------------------------------------------------------------------

    def generate(self, user_texts: Sequence[str], *, seed: int, greedy: bool = False) -> list[Generation]:
        msgs = [[{"role": "system", "content": self.templates["EXTRACTOR_SYSTEM"]}, {"role": "user", "content": u}]
                for u in user_texts]
        prompts = [list(self.infer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)) for m in msgs]
        mc = self.xc.model
        outs = self.infer.generate(prompts, max_new_tokens=mc.max_new_tokens, temperature=0.0 if greedy else mc.temperature,
                                     top_p=mc.top_p, seed=seed)
        return [Generation(prompt=u, response=o.text, prompt_ids=p, response_ids=list(o.token_ids),
                           response_logprobs=list(o.logprobs), model_version=self.updates)
                for u, p, o in zip(user_texts, prompts, outs)]

    # -- distillation (background) -----------------------------------------------------------------

    def queue_distillation(self, episodes: Sequence[Episode], step: int) -> None:
        """Every finished episode, success or failure, to the distillation queue (docs/method.md step 3); past
        extractor.max_backlog an episode is dropped and counted. Its results (entries written, parse failures) show
        in `totals()`."""
        for e in episodes:
            if self._queue.qsize() >= self.xc.max_backlog:
                self.counters["dropped"] += 1
                continue
            self._queue.put((e, step))
        if self.deterministic:
            self.wait_idle()  # reproducible runs: the library after step t does not depend on thread timing

    def _consume(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while len(batch) < 16:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is None for b in batch)
            work = [b for b in batch if b is not None]
            if work:
                try:
                    self.distil(work)
                except Exception as e:  # a bad batch must not kill the consumer; it is counted
                    print(f"distillation failed: {type(e).__name__}: {e}", flush=True)
                    self.counters["parse_failures"] += len(work)
            for _ in batch:
                self._queue.task_done()
            if stop:
                return

    def distil_prompt(self, task: str, success: bool, steps: Sequence[tuple[str, str]], final_observation: str,
                      previous: Sequence[str] = (), num_actions: int | None = None) -> str:
        return extraction_user(self.templates, self.xc, task, success, steps, final_observation, previous, num_actions)

    def distil(self, work: Sequence[tuple[Episode, int]]) -> list[Parsed]:
        """One generate call for a batch of episodes; operations applied through the manager."""
        users, prev_ids = [], []
        for e, _ in work:
            ids = list(e.traj.experience_ids)
            texts = self.manager.entry_texts(ids)
            ids = [i for i in ids if i in texts]
            prev_ids.append(ids)
            users.append(self.distil_prompt(e.traj.task, e.success, [(s.observation, s.action) for s in e.traj.steps],
                                            e.traj.final_observation, [texts[i] for i in ids], e.traj.num_actions))
        gens = self.generate(users, seed=derive_seed(self.seed, work[0][1], "distil", len(users)))
        results = []
        for (e, step), ids, g in zip(work, prev_ids, gens):
            parsed = parse_extraction(g.response, ids, budget=self.xc.op_budget, max_chars=self.library.manager.max_text_chars)
            results.append(parsed)
            with self._lock:
                self.counters["distilled"] += 1
                if parsed.error:
                    self.counters["parse_failures"] += 1
                    continue
            for op in parsed.ops:
                op.generation = g
            res = self.manager.apply_operations(parsed.ops, OpContext(env=e.spec.env, task=e.traj.task, query=e.traj.task,
                                                                      run_id=self.run_id, step=step, episode_id=e.store_id,
                                                                      source=Source.EXTRACTED))
            with self._lock:
                self.counters["adds"] += sum(r.ok and r.op.kind == "add" for r in res)
                self.counters["updates_ops"] += sum(r.ok and r.op.kind == "update" for r in res)
                self.counters["refused_ops"] += sum(not r.ok for r in res)
        return results

    def wait_idle(self, timeout: float = 600.0) -> None:
        """Block until the distillation queue is empty (tests and the deterministic mode use it)."""
        t0 = time.time()
        while self._queue.unfinished_tasks and time.time() - t0 < timeout:
            time.sleep(0.05)

    # -- search-and-ask (docs/method.md step 2) ------------------------------------------------------------

    def tool_fn(self, task: str, query: str, env: str, step: int) -> tuple[str, list[int], Any]:
        """The Roller's search-and-ask tool (it measures each call's latency: search_and_ask/latency_ms)."""
        self.counters["tool_calls"] += 1
        hits = self.manager.search_sync([query or task], k=1, task=env, scope=[task], step=step)[0]
        if not hits:
            return "", [], None
        self.counters["tool_hits"] += 1
        user = self.templates["REWRITE_USER"].format(task=task, query=query, entry=hits[0].text)
        gen = self.generate([user], seed=derive_seed(self.seed, step, "rewrite", self.counters["tool_calls"]))[0]
        answer = parse_rewrite(gen.response) or hits[0].text  # an unparsable rewrite falls back to the entry itself
        return answer, [hits[0].entry_id], gen

    # -- credit and CISPO ------------------------------------------------------------------------------

    def score(self, episodes: Sequence[Episode], step: int) -> dict[str, float]:
        """Credit retrieved entries with the outcomes they guided (the store's usage counters); each credited entry's
        generation, and each search-and-ask rewrite, becomes a CISPO sample in the buffer."""
        retrieved = [list(e.traj.experience_ids) for e in episodes]
        outcomes = torch.tensor([float(e.success) for e in episodes])
        baselines = None
        if self.xc.relative_reward:
            baselines = experience_free_baseline(outcomes, torch.tensor([e.spec.with_experience for e in episodes]),
                                                 torch.tensor([e.spec.group_id for e in episodes]))
        if any(e.critic_scores for e in episodes):  # actor as critic: score + outcome
            rewards = critic_entry_rewards([e.critic_scores for e in episodes], retrieved, outcomes, baselines=baselines)
        else:
            rewards = entry_rewards(retrieved, outcomes, baselines=baselines)  # entry id -> mean signed outcome
        # the relative reward beside the one trained on (the credit diagnostics); the same one when it is trained on
        free = baselines if baselines is not None else experience_free_baseline(
            outcomes, torch.tensor([e.spec.with_experience for e in episodes]), torch.tensor([e.spec.group_id for e in episodes]))
        relative = entry_rewards(retrieved, outcomes, baselines=free)
        used = [(i, e) for e in episodes for i in sorted(set(e.traj.experience_ids))]
        if used:
            self.store.record_outcomes([(i, e.success, e.reward) for i, e in used], run_id=self.run_id, step=step,
                                       episode_ids=[e.store_id for _, e in used])
        new = 0
        if self.trains and rewards:
            entries = self.store.get_many(rewards)  # read after this step's outcomes were recorded
            if self.xc.credit == "lifetime" and baselines is None and not any(e.critic_scores for e in episodes):
                rewards = {i: _lifetime(entries[i], r) if i in entries else r for i, r in rewards.items()}
            for i, r in rewards.items():
                g = entries[i].generation if i in entries else None
                if g is not None and g.response_ids:
                    self.buffer.append(Sample(i, list(g.prompt_ids), list(g.response_ids), list(g.response_logprobs), r))
                    new += 1
            # search-and-ask rewrites are samples too, credited with their episode's outcome
            for e in episodes:
                for g in e.tool_generations:
                    if g.response_ids:
                        self.buffer.append(Sample(None, list(g.prompt_ids), list(g.response_ids), list(g.response_logprobs),
                                                  1.0 if e.success else -1.0))
                        new += 1
        self.last_credit = {i: (r, relative.get(i, r)) for i, r in rewards.items()}
        # the signal's density (issue: can the extractor learn from it?): how many episodes each entry's reward averages
        readers = [sum(i in set(ids) for ids in retrieved) for i in rewards]
        return {"extractor/new_samples": float(new), "retrieval/hit_rate": _hit_rate(episodes),
                **({"extractor/episodes_per_entry_reward": sum(readers) / len(readers),
                    "extractor/entries_rewarded": float(len(readers))} if readers else {})}

    def maybe_update(self, step: int) -> dict[str, float]:
        if not self.trains or len(self.buffer) < self.xc.buffer_size:
            return {}
        batch, self.buffer = self.buffer[: self.xc.buffer_size], self.buffer[self.xc.buffer_size:]
        return self.update(batch, step)

    def eq7_weights(self, batch: Sequence[Sample]) -> torch.Tensor:
        """Eq. 7 by entry id (rewrites, which have no entry, get weight 1)."""
        ids = [s.entry_id for s in batch if s.entry_id is not None]
        stats = self.store.training_stats(ids)
        counts = {i: c for i, (c, _) in stats.items()}
        last = {i: l for i, (_, l) in stats.items()}
        w_ids = weights_for_entries(ids, counts, last, self.updates, alpha=self.xc.alpha, cooldown=self.xc.cooldown)
        w = torch.ones(len(batch))
        j = 0
        for k, s in enumerate(batch):
            if s.entry_id is not None:
                w[k] = w_ids[j]
                j += 1
        return w

    def update(self, batch: Sequence[Sample], step: int) -> dict[str, float]:
        rewards = torch.tensor([s.reward for s in batch], dtype=torch.float32)  # (N,)
        weights = self.eq7_weights(batch) if self.xc.reweight else None
        adv = extractor_advantages(rewards, weights)  # (N,) = (r − mean_batch r) · w
        model = self.backend.model
        mb = self.xc.model.micro_batch
        n_tok = float(sum(len(s.response_ids) for s in batch))  # the batch's reply tokens: the loss is their mean
        total = kl_sum = 0.0
        logps = []
        lr = warmed_lr(self.optimizer, self.xc.model.lr, self.xc.model.lr_warmup)
        with self.backend.lock:
            model.train()
            self.optimizer.zero_grad(set_to_none=True)
            for s in range(0, len(batch), mb):
                sl = slice(s, s + mb)
                ids, attn, m, o = reply_tensors([(x.prompt_ids, x.response_ids, x.old_logprobs) for x in batch[sl]],
                                                self.backend.pad_id)  # ids, attention, loss mask, old log-probs (n, T)
                if self.reference is None:
                    lp, _ = row_logprobs(self.backend, ids, attn, m)  # (n, T), 0 off the mask
                else:
                    lp, kl = row_logprobs_kl(self.backend, self.reference, ids, attn, m)  # kl: exact, per reply token
                m, o = m.to(lp.device), o.to(lp.device)  # the learner's device (a GPU too)
                loss = cispo_loss(lp, o, adv[sl].to(lp.device), m, eps_low=self.xc.eps_low, eps_high=self.xc.eps_high) * (float(m.sum()) / max(n_tok, 1))
                if self.reference is not None:
                    kl_mean = (kl * m).sum() / max(n_tok, 1)  # the batch's reply-token mean, as the CISPO term's
                    loss = loss + self.xc.kl_coef * kl_mean
                    kl_sum += float(kl_mean.detach())
                loss.backward()
                total += float(loss.detach())
                logps.append((lp.detach(), o, m))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.backend.trainable_parameters(), self.xc.model.grad_clip)
            self.optimizer.step()
            model.eval()
        self.updates += 1
        sync: dict[str, float] = {}
        if self.infer is not self.backend:
            self.infer.sync_weights(self.backend.state_dict_for_sync())
            sync = checked_sync_metrics(self.infer, self.backend, [x.prompt_ids + x.response_ids for x in batch[:4]],
                                        "sync/extractor_")
        trained = [s.entry_id for s in batch if s.entry_id is not None]
        # recorded at the update's index, so the next update sees steps_since_trained = 1
        self.store.record_trained(trained, self.updates - 1, run_id=self.run_id, run_step=step)  # a resume takes it back
        st = [cispo_stats(lp, o, m, eps_low=self.xc.eps_low, eps_high=self.xc.eps_high) for lp, o, m in logps]
        w = weights if weights is not None else torch.ones(len(batch))
        return {
            "extractor/loss": total, "extractor/reward_mean": float(rewards.mean()), "extractor/grad_norm": float(grad_norm),
            "extractor/weight_mean": float(w.mean()), "extractor/weight_zero_frac": float((w == 0).float().mean()),
            "extractor/clip_frac": sum(x["clip_frac"] for x in st) / len(st), "extractor/updates": float(self.updates),
            # samples whose advantage is not zero: the only ones the update learns from
            "extractor/frac_nonzero_adv": float((adv.abs() > 1e-8).float().mean()), "extractor/reward_std": float(rewards.std(unbiased=False)),
            "extractor/lr": lr, **({"extractor/kl_ref": kl_sum} if self.reference is not None else {}), **sync,
        }

    # -- merge (docs/method.md step 4) ---------------------------------------------------------------------

    def merge(self, step: int) -> dict[str, float]:
        """Walk the library task by task in chunks; the extractor decides what to keep, merge or discard.

        Each task's entries are walked in `library.merge.order` (similar entries share chunks), cut into
        `library.merge.walks` walks; the walks of every task run side by side, `library.merge.batch`
        chunks per batched generation."""
        self.wait_idle()
        self.manager.sync()  # entries written without embeddings (UI, import) get them before the ordering
        mc = self.library.merge
        before = self.store.count()
        t0 = time.perf_counter()
        tasks: dict[tuple[str, str], list[Experience]] = {}
        offset = 0
        while True:
            page = self.store.list_entries(offset=offset, limit=2000)
            for e in page.entries:
                tasks.setdefault((e.env, e.task), []).append(e)
            offset += len(page.entries)
            if not page.entries:
                break
        walks: list[list[Experience]] = []
        for entries in tasks.values():
            if len(entries) < 2:
                continue
            if mc.order == "similarity":
                entries = similarity_order(entries, self.store.embeddings([e.id for e in entries], "text"))
            else:
                entries = sorted(entries, key=lambda e: e.id)
            walks += split_walks(entries, mc.walks, mc.chunk_size)

        def merge_batch(chunks: list[list[Experience]]) -> list[list[Operation] | str]:
            users = [self.templates["MERGE_USER"].format(task=c[0].task, entries=P.numbered([e.text for e in c])) for c in chunks]
            gens = self.generate(users, seed=derive_seed(self.seed, step, "merge", chunks[0][0].id), greedy=True)
            out = []
            for c, g in zip(chunks, gens):
                p = parse_merge_answer(g.response, c)
                for op in p.ops:
                    op.generation = g  # merge generations are credited like extraction ones when retrieved
                out.append(p.error or p.ops)  # a reason keeps the chunk's originals and is reported
            return out

        rep = merge_walks(self.store, walks, merge_batch, chunk_size=mc.chunk_size, batch=mc.batch, actor="extractor",
                          step=step, run_id=self.run_id, on_written=self.manager.sync)
        self.counters["merges"] += rep.merges
        self.last_merge = rep  # its errors say why chunks were kept (benchmarks/bench_merge.py counts them)
        return {"library/merge_before": float(before), "library/merge_after": float(self.store.count()),
                "library/merges": float(rep.merges), "library/merge_discards": float(rep.discards),
                "library/merge_unparsed": float(rep.unparsed_chunks), "library/merge_chunks": float(rep.chunks),
                "library/merge_walks": float(len(walks)), "time/merge_s": time.perf_counter() - t0}

    # -- metrics, state, life cycle ------------------------------------------------------------------------

    def totals(self) -> dict[str, float]:
        """Running counters since the run began and the state now (buffer, backlog, library size); reading them
        changes nothing."""
        c = self.counters
        return {"extractor/buffer": float(len(self.buffer)), "extractor/backlog": float(self._queue.qsize()),
                "extractor/parse_failures": float(c["parse_failures"]), "extractor/distilled": float(c["distilled"]),
                "extractor/dropped": float(c["dropped"]), "library/size": float(self.manager.active_count()),
                "library/adds": float(c["adds"]), "library/updates": float(c["updates_ops"]),
                "library/refused_ops": float(c["refused_ops"]), "search_and_ask/calls": float(c["tool_calls"]),
                "extractor/updates": float(self.updates)}

    def models_to_save(self) -> dict[str, Any]:
        return {"extractor": self.backend} if self.backend is not None else {}  # an endpoint's weights are the server's

    def state_dict(self) -> dict[str, Any]:
        self.wait_idle()
        return {"optimizer": self.optimizer.state_dict() if self.optimizer else None, "updates": self.updates,
                "buffer": [s.__dict__ for s in self.buffer], "counters": dict(self.counters)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if self.optimizer is not None and st.get("optimizer"):
            self.optimizer.load_state_dict(st["optimizer"])
        self.updates = int(st.get("updates", 0))
        self.buffer = [Sample(**d) for d in st.get("buffer", [])]
        self.counters.update(st.get("counters", {}))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=120)


def _lifetime(entry: Experience, fallback: float) -> float:
    """The mean signed outcome (+1 success, −1 failure) of every episode that has retrieved `entry`."""
    n = entry.successes + entry.failures
    return (entry.successes - entry.failures) / n if n else fallback


def _hit_rate(episodes: Sequence[Episode]) -> float:
    want = [e for e in episodes if e.spec.with_experience]
    return sum(bool(e.traj.experience_ids) for e in want) / len(want) if want else 0.0


def propose_merge(store: ExperienceStore, ids: Sequence[int], *, data_dir: str, model_path: str = "") -> str:
    """The extractor's proposed text for merging `ids` (the workbench's merge dialog)."""
    entries = [store.get(i) for i in ids]
    backend = HFBackend(model_path or resolve_model_path("embedded:extractor", data_dir))
    user = P.MERGE_USER.format(task=entries[0].task, entries=P.numbered([e.text for e in entries]))
    msgs = [{"role": "system", "content": P.EXTRACTOR_SYSTEM}, {"role": "user", "content": user}]
    out = backend.generate([list(backend.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))],
                           max_new_tokens=200, temperature=0.0)[0]
    ops = parse_merge(out.text, entries)
    merged = [op.text for op in ops or [] if op.kind == "update" and set(op.ids) == set(ids)]
    if merged:
        return merged[0]
    raise ValueError("the extractor's answer did not propose one merged text for these entries; write it by hand")
