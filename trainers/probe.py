"""The extractor's skill, measured apart from the policy (docs/method.md "Extractor objective" is what it checks).

    probe = ExtractorProbe.for_run(cfg, run_dir)   # None where no env of the run has an entry checker
    probe.measure(experience, step)                # -> extractor/probe_* metrics

A fixed held-out set of finished trajectories on the run's seen recurring tasks (env.task_set): the scripted expert
plays each task clean and with a share of random actions, so the set holds successes and failures, episodes that saw
the staircase and episodes that never did. It is built once, from the run's seed, and saved with the run
(runs/<id>/probe_trajectories.json), so every probe of the run (and of its resume) reads the same ones. The current
extractor distils each one greedily, from the same prompt a run's distillation shows it (ExperienceLoop.distil_prompt,
no previous entries), and the checker that scores library entries (envs/entry_check.py) judges every entry written:

    extractor/probe_correct        entries whose claim is right for their task, over all entries written
    extractor/probe_wrong          entries whose claim is wrong
    extractor/probe_unverifiable   entries that state no checkable claim (or whose task's layout is unknown)
    extractor/probe_valid          answers that parse to an operation list (the empty list included)
    extractor/probe_heading_right  entries whose claimed offset, right or not, gives the true first heading (the one
                                   word a reader acts on: "2 south and 1 east" for "3 south and 1 east" still says south)
    extractor/probe_entries        entries written per answer
    extractor/probe_stated_right   of the trajectories whose debrief says where the staircase was, the share whose
                                   answer wrote an entry that says it (what a reader of that trajectory could know)

Nothing is written to the library: the probe only reads the extractor.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from envs.entry_check import EntryChecker
from trainers.parsing import parse_extraction
from trainers.rollout import derive_seed

PROBE_FILE = "probe_trajectories.json"
NOISE = (0.0, 0.2, 0.4, 0.6)  # the scripted expert's share of random actions, one episode of each per task and round


@dataclass
class ProbeTrajectory:
    env: str
    task: str
    success: bool
    steps: list[tuple[str, str]]  # (observation, action)
    final_observation: str
    noise: float


def probe_trajectories(env_names: Sequence[str], task_set: int, *, n: int, max_turns: int, seed: int) -> list[ProbeTrajectory]:
    """`n` finished episodes on tasks 0 .. task_set-1 of the envs with a checker, played by the scripted expert with
    NOISE's shares of random actions in turn (envs/pool.py LocalPool, the Roller: the project's one episode loop)."""
    from trainers.warmstart.common import WarmStartConfig
    from trainers.warmstart.teachers import play_episodes

    envs = [e for e in env_names if EntryChecker.supports(e)]
    if not envs or task_set < 1 or n < 1:
        return []
    specs = []
    k = 0
    while len(specs) < n:
        env = envs[k % len(envs)]
        tid = (k // len(envs)) % task_set
        specs.append((env, tid, "none", NOISE[(k // (len(envs) * task_set)) % len(NOISE)]))
        k += 1
    cfg = WarmStartConfig(envs=envs, max_turns=max_turns, seed=seed)
    out = []
    # one play per noise level, so that two episodes of a task with the same noise are still different episodes
    for eps in dict.fromkeys(sp[3] for sp in specs):
        mine = [sp for sp in specs if sp[3] == eps]
        demos = play_episodes(cfg, mine, source="probe", seed=derive_seed(seed, "probe", eps))
        out += [ProbeTrajectory(d.env, d.task, bool(d.success), [(t.observation, t.taken) for t in d.turns],
                                d.final_observation, eps) for d in demos]
    return out


def save_trajectories(path: Path, trajectories: Sequence[ProbeTrajectory]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(t) for t in trajectories]))
    tmp.replace(path)


def load_trajectories(path: Path) -> list[ProbeTrajectory]:
    """The saved set; raises ValueError with the file's name when it does not parse as one."""
    try:
        rows = json.loads(path.read_text())
        return [ProbeTrajectory(r["env"], r["task"], bool(r["success"]), [(str(o), str(a)) for o, a in r["steps"]],
                                r["final_observation"], float(r["noise"])) for r in rows]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a probe trajectory file ({type(e).__name__}: {e}); delete it to rebuild the set") from None


class ExtractorProbe:
    def __init__(self, trajectories: Sequence[ProbeTrajectory], seed: int = 0) -> None:
        self.trajectories = list(trajectories)
        self.seed = seed
        self.checker = EntryChecker()

    @classmethod
    def for_run(cls, cfg: Any, run_dir: Path) -> "ExtractorProbe | None":
        """The run's probe (None where extractor.probe_every is 0, the run has no experience, or no env has a checker
        and a recurring task set): its saved set, or a new one built from the run's seed and saved."""
        xc = cfg.extractor
        if not xc.probe_every or not cfg.uses_experience or not cfg.env.task_set:
            return None
        if not any(EntryChecker.supports(e) for e in cfg.env.names):
            return None
        path = Path(run_dir) / PROBE_FILE
        if path.is_file():
            return cls(load_trajectories(path), seed=cfg.run.seed)
        trajs = probe_trajectories(list(cfg.env.names), cfg.env.task_set, n=xc.probe_size, max_turns=cfg.env.max_turns,
                                   seed=cfg.run.seed)
        if not trajs:
            return None
        save_trajectories(path, trajs)
        return cls(trajs, seed=cfg.run.seed)

    def measure(self, experience: Any, step: int) -> dict[str, float]:
        """Greedy distillation of every probe trajectory by `experience` (an ExperienceLoop), its entries checked."""
        t0 = time.perf_counter()
        experience.wait_idle()  # the background distiller and the probe share the extractor's back end
        gens = experience.generate(self.prompts(experience.templates, experience.xc), seed=derive_seed(self.seed, step, "probe"),
                                   greedy=True)
        return self.score([g.response for g in gens], budget=experience.xc.op_budget,
                          max_chars=experience.library.manager.max_text_chars) | {"time/probe_s": time.perf_counter() - t0}

    def prompts(self, templates: dict[str, str], xc: Any) -> list[str]:
        """The extraction prompt's user message for every trajectory, as a run's distillation builds it (no previous
        entries)."""
        from trainers.extractor import extraction_user

        return [extraction_user(templates, xc, t.task, t.success, t.steps, t.final_observation) for t in self.trajectories]

    def measure_model(self, backend: Any, cfg: Any) -> dict[str, float]:
        """The same measurement for a bare model back end (a build's check), with run config `cfg`'s prompt settings."""
        from trainers import prompts as P

        xc = cfg.extractor
        templates = P.load_templates(xc.templates_file or None)
        msgs = [[{"role": "system", "content": templates["EXTRACTOR_SYSTEM"]}, {"role": "user", "content": u}]
                for u in self.prompts(templates, xc)]
        ids = [list(backend.apply_chat_template(m, add_generation_prompt=True, tokenize=True)) for m in msgs]
        outs = backend.generate(ids, max_new_tokens=xc.model.max_new_tokens, temperature=0.0, seed=self.seed)
        return self.score([o.text for o in outs], budget=xc.op_budget, max_chars=cfg.library.manager.max_text_chars)

    def score(self, answers: Sequence[str], *, budget: int, max_chars: int) -> dict[str, float]:
        """The probe's metrics for one answer per trajectory, in order."""
        from envs.base import task_id_of
        from envs.minihack import claimed_offset, first_heading

        valid = entries = right = wrong = heading = 0
        stated = stated_right = 0
        for t, text in zip(self.trajectories, answers):
            parsed = parse_extraction(text, [], budget=budget, max_chars=max_chars)
            truth = claimed_offset(t.final_observation)  # the debrief's own words, when it saw the staircase
            if truth is not None:
                stated += 1
            if parsed.error:
                continue
            valid += 1
            wrote_truth = False
            for op in parsed.ops:
                if op.kind not in ("add", "update") or not op.text:
                    continue
                entries += 1
                v = self.checker.verdict(t.env, t.task, op.text)
                right += v == "right"
                wrong += v == "wrong"
                if v in ("right", "wrong") and t.env.startswith("minihack/"):  # a heading is MiniHack's alone
                    claim, tid = claimed_offset(op.text), task_id_of(t.task)
                    heading += first_heading(*claim) == first_heading(*self.checker.facts(t.env, tid)["offset"])
                wrote_truth |= truth is not None and claimed_offset(op.text) == truth
            stated_right += wrote_truth
        n = max(1, len(self.trajectories))
        out = {"extractor/probe_valid": valid / n, "extractor/probe_entries": entries / n}
        if entries:
            out |= {"extractor/probe_correct": right / entries, "extractor/probe_wrong": wrong / entries,
                    "extractor/probe_unverifiable": (entries - right - wrong) / entries,
                    "extractor/probe_heading_right": heading / entries}
        else:  # nothing written: no entry is right (the share a reader would be helped by)
            out |= {"extractor/probe_correct": 0.0, "extractor/probe_wrong": 0.0, "extractor/probe_unverifiable": 0.0}
        if stated:
            out["extractor/probe_stated_right"] = stated_right / stated
        return out

    def close(self) -> None:
        self.checker.close()
