"""Can the extractor find the right lesson by sampling? On the probe's trajectories whose debrief states where the
staircase was, the share of sampled answers whose entry states it, split by whether the greedy answer on the same
trajectory already does.

    python benchmarks/extractor_exploration.py --model /work/data/models/extractor-weak --temperatures 0.8,1.0 --draws 8

CISPO, rewarded by outcomes, can only raise a claim the extractor samples: on a trajectory where greedy writes a
wrong claim, the greedy probe (extractor/probe_correct) flips only after sampled right answers there are rewarded
above the wrong ones. The sampled right share on greedy-wrong trajectories is that exploration rate; the run's
distillations sample at extractor.model.temperature (0.8 in configs/coevolution_cpu.yaml). Same trajectories,
prompts and checker as the run's probe (trainers/probe.py), the co-evolution config's seen tasks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, write_results  # noqa: E402


def states_truth(traj, text: str, cfg) -> bool:
    from envs.minihack import claimed_offset
    from trainers.parsing import parse_extraction

    truth = claimed_offset(traj.final_observation)
    p = parse_extraction(text, [], budget=cfg.extractor.op_budget, max_chars=cfg.library.manager.max_text_chars)
    return not p.error and any(op.kind in ("add", "update") and op.text and claimed_offset(op.text) == truth for op in p.ops)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an extractor model folder")
    ap.add_argument("--config", default=str(ROOT / "configs" / "coevolution_cpu.yaml"))
    ap.add_argument("--temperatures", default="0.8")
    ap.add_argument("--draws", type=int, default=8, help="sampled answers per trajectory and temperature")
    ap.add_argument("--out", default="extractor_exploration")
    args = ap.parse_args(argv)

    from envs.minihack import claimed_offset
    from trainers import prompts as P
    from trainers.config import load_run_config
    from trainers.models import load_backend
    from trainers.probe import ExtractorProbe, probe_trajectories

    cfg = load_run_config(args.config)
    xc = cfg.extractor
    trajs = probe_trajectories(list(cfg.env.names), cfg.env.task_set, n=xc.probe_size, max_turns=cfg.env.max_turns, seed=0)
    stated = [t for t in trajs if claimed_offset(t.final_observation) is not None]
    probe = ExtractorProbe(stated)
    templates = P.load_templates(xc.templates_file or None)
    backend = load_backend("hf", args.model, device="cpu", quiet=True)
    msgs = [[{"role": "system", "content": templates["EXTRACTOR_SYSTEM"]}, {"role": "user", "content": u}]
            for u in probe.prompts(templates, xc)]
    ids = [list(backend.apply_chat_template(m, add_generation_prompt=True, tokenize=True)) for m in msgs]
    gen = lambda temp, seed: [o.text for o in backend.generate(ids, max_new_tokens=xc.model.max_new_tokens,  # noqa: E731
                                                                temperature=temp, seed=seed)]
    greedy = [states_truth(t, a, cfg) for t, a in zip(stated, gen(0.0, 0))]
    rows = []
    for temp in [float(x) for x in args.temperatures.split(",")]:
        hits = {True: [0, 0], False: [0, 0]}  # greedy right?: [sampled right, sampled]
        for d in range(args.draws):
            for g, t, a in zip(greedy, stated, gen(temp, 1000 + d)):
                hits[g][0] += states_truth(t, a, cfg)
                hits[g][1] += 1
        rows.append({"temperature": temp, "draws": args.draws,
                     "greedy_right_trajectories": sum(greedy), "greedy_wrong_trajectories": len(greedy) - sum(greedy),
                     "sampled_right_where_greedy_right": round(hits[True][0] / max(1, hits[True][1]), 3),
                     "sampled_right_where_greedy_wrong": round(hits[False][0] / max(1, hits[False][1]), 3),
                     "sampled_right_overall": round((hits[True][0] + hits[False][0]) / max(1, hits[True][1] + hits[False][1]), 3)})
        print(rows[-1], flush=True)
    md = [f"Model `{args.model}`; {len(stated)} probe trajectories whose debrief states the layout (of {len(trajs)}), "
          f"{args.draws} sampled answers each per temperature.", "",
          "| temperature | greedy right on | sampled right where greedy is right | sampled right where greedy is wrong | sampled right, all |",
          "|---:|---:|---:|---:|---:|"]
    md += [f"| {r['temperature']} | {r['greedy_right_trajectories']}/{len(stated)} | {r['sampled_right_where_greedy_right']:.3f} | "
           f"{r['sampled_right_where_greedy_wrong']:.3f} | {r['sampled_right_overall']:.3f} |" for r in rows]
    write_results(args.out, {"benchmark": "extractor_exploration", "environment": environment(), "argv": sys.argv,
                             "model": args.model, "trajectories": len(trajs), "stated": len(stated), "rows": rows}, "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
