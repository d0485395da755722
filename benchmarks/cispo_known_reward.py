"""The known-reward CISPO test (tests/test_coevolution.py::test_cispo_learns_from_a_known_reward) with knobs: learning
rate, extractor.kl_coef, updates. Prints each update's sampled reward and unparsable share, the greedy probe every
--probe-every updates, and the greedy answers that do not parse at the end; writes <tag>.json (probe before/after).

    python benchmarks/cispo_known_reward.py --weak DATA/models/extractor-weak --lr 4e-4 --kl 0.3 --tag run

Results: benchmarks/results/cispo_known_reward.{json,md}."""
import argparse, json, random, sys, tempfile, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from test_coevolution import ENV, _known_reward
from envs.minihack import claimed_offset
from trainers.config import load_run_config
from trainers.extractor import ExperienceLoop, Sample
from trainers.probe import ExtractorProbe, probe_trajectories
from trainers.parsing import parse_extraction
from core.store import ExperienceStore

ap = argparse.ArgumentParser()
ap.add_argument("--weak", required=True, help="the weak extractor folder (comprl models init-weak)")
ap.add_argument("--lr", type=float, default=None)
ap.add_argument("--kl", type=float, default=None)
ap.add_argument("--updates", type=int, default=20)
ap.add_argument("--probe-every", type=int, default=5)
ap.add_argument("--tag", default="run")
a = ap.parse_args()
ov = {"extractor": {"model": {"path": a.weak}, "reweight": False}}
if a.lr is not None: ov["extractor"]["model"]["lr"] = a.lr
if a.kl is not None: ov["extractor"]["kl_coef"] = a.kl
cfg = load_run_config(ROOT / "configs" / "coevolution_cpu.yaml", overrides=ov)
xc = cfg.extractor
print("lr", xc.model.lr, "kl", xc.kl_coef, flush=True)
pool = [t for t in probe_trajectories([ENV], 16, n=128, max_turns=8, seed=1) if claimed_offset(t.final_observation) is not None]
probe = ExtractorProbe(probe_trajectories([ENV], 16, n=64, max_turns=8, seed=0))
tmp = Path(tempfile.mkdtemp())
store = ExperienceStore(f"sqlite:///{tmp}/s.db")
loop = ExperienceLoop(xc, cfg.library, store, None, seed=0, threads=1, trains=True, deterministic=True, data_dir=tmp, run_id=store.create_run("cispo"))
def pm(u):
    m = probe.measure(loop, u)
    print(f"PROBE u={u} correct={m['extractor/probe_correct']:.3f} valid={m['extractor/probe_valid']:.3f}", flush=True)
    return m
before = pm(0)
rng = random.Random(0)
t0 = time.time()
for u in range(a.updates):
    batch = [rng.choice(pool) for _ in range(xc.buffer_size)]
    gens = loop.generate([loop.distil_prompt(t.task, t.success, t.steps, t.final_observation) for t in batch], seed=1000 + u)
    samples = [Sample(None, g.prompt_ids, g.response_ids, g.response_logprobs, _known_reward(g.response, claimed_offset(t.final_observation), xc.op_budget)) for g, t in zip(gens, batch)]
    unpars = sum(1 for g in gens if parse_extraction(g.response, [], budget=xc.op_budget).error)
    lens = sorted(len(g.response_ids) for g in gens)
    st = loop.update(samples, u)
    print(f"u={u} reward={sum(s.reward for s in samples)/len(samples):+.2f} unparsable={unpars}/{len(gens)} len_med={lens[len(lens)//2]} len_max={lens[-1]} kl={st.get('extractor/kl_ref', 0):.4f} gn={st['extractor/grad_norm']:.2f} t={time.time()-t0:.0f}s", flush=True)
    if (u + 1) % a.probe_every == 0 and u + 1 < a.updates:
        pm(u + 1)
after = pm(a.updates)
gens = loop.generate(probe.prompts(loop.templates, xc), seed=0, greedy=True)
bad = [(g.response, parse_extraction(g.response, [], budget=xc.op_budget).error) for g in gens]
bad = [b for b in bad if b[1]]
print("UNPARSABLE", len(bad))
for r, e in bad[:6]:
    print("ERR:", e, "\nTEXT:", repr(r[-400:]), "\n", flush=True)
json.dump({"before": before, "after": after}, open(f"{a.tag}.json", "w"))
loop.close(); probe.close()
