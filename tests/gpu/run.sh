#!/usr/bin/env bash
# One prepared GPU check for roll (issue 14): every `gpu` test plus the pipeline runs the machine can hold, one table.
#
#   bash tests/gpu/run.sh --prepare   where PyPI is reachable: build .gpu-bundle/roll-gpu-bundle-cp312.tar.xz
#                                     (.gitignore'd; tests/gpu/bundle.py): Ray 2.60 slimmed, megatron-core, pydantic
#                                     and every other package the lent machine's image lacks (versions from uv.lock,
#                                     cp312 manylinux x86_64) and roll's wheels; ~20 MiB, inside the 64 MiB a lent
#                                     device machine is carried (name .gpu-bundle in `carry`). BUNDLE_PYTHON and
#                                     BUNDLE_HAVE (default 3.12, tests/gpu/image_packages.txt) retarget it
#   bash tests/gpu/run.sh             on the GPU machine, offline: installs the bundle (if there) with pip --no-index
#                                     into /tmp/roll-gpu/site-packages beside the machine's own torch and transformers
#                                     (tests/gpu/install_bundle.sh), runs the lines below, prints one table; exit 1
#                                     if a line FAILed. Without a bundle it uses `uv run` in the synced workspace (uv
#                                     sync --extra megatron first, on a box with PyPI). Without CUDA every line SKIPs,
#                                     saying why. tests/gpu/prove_bundle.sh proves the bundle's path on a CPU box.
#
# GPU_LINES=REGEX runs only the lines whose names match (the install always runs), e.g. GPU_LINES='peak|rlvr hf'
# to fit one device call's 10 minutes; the rlvr line needs the peak line.
# Logs: $OUT/gpu_check.log (all lines' output) and $OUT/gpu_table.txt; OUT defaults to outputs/gpu_check.
# What each line proves:
#
#   environment               python, torch, CUDA, GPU count, and which optional stacks import (megatron, ray, vllm)
#   megatron tp=1 (3 roles)   Megatron-Core on one GPU in the three roles, fp32: the actor's step lowers the loss and
#                             its HF export scores like the trainer (test_gpu_strategies); the critic's values equal
#                             its HF model's, a step lowers the value loss, the export loads as
#                             AutoModelForTokenClassification (test_megatron_heads); the student's log-probs equal its
#                             HF model's and a distillation step lowers the KD loss (test_megatron_roles)
#   megatron tp2 vs tp1       (two GPUs) TP=2 gives TP=1's log-probs/values, loss, grad norm and updated weights on one
#                             batch for the actor, the critic and the student
#   cuda batch, rng, ipc      a CUDA Batch pads and pickles to CPU; CUDA RNG state round-trips through a checkpoint;
#                             a CUDA IPC weight bucket opens in another process
#   vllm gpu tests            vLLM: n samples with HF-matching log-probs, sleep/wake, weight and LoRA updates, images
#   rlvr hf+fsdp2 hybrid bf16 the quickstart's pipeline on CUDA (hf generator and fsdp2 trainer in one actor, placement
#                             hybrid; bf16) with a ~0.36B Qwen2 built from a config and a 1024-row batch: 6 RL steps
#                             after a 20-step warm-up; prints s/step, tokens/s and MFU against the bf16 peak that the
#                             "bf16 matmul peak" line measured in the same run (tests/gpu/perf.py says how) (needs Ray)
#   sft megatron tp=1         SFT on Megatron through `roll train` (MP_SPLIT dispatch, checkpoint, HF export): the loss
#                             falls and the export loads with transformers (needs Ray)
#   rlvr vllm+fsdp2 colocated the quickstart with fsdp2 training and vLLM (sleep level 2) sharing one GPU: 4 steps, the
#                             policy version advances, colocate/* offload metrics show memory freed (needs Ray, vLLM)
#
# On a lent device machine (one H200, nothing reachable, 64 MiB carried) vLLM does not fit (its wheels are far over
# 64 MiB), so its two lines SKIP there with that reason; with the bundle carried every other line runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=.gpu-bundle/roll-gpu-bundle-cp${BUNDLE_PYTHON:-3.12}.tar.xz
BUNDLE=${BUNDLE/3./3}

prepare() {  # the bundle a bare CUDA machine (python 3.12, torch and transformers present) needs; tests/gpu/bundle.py
  # The bundle assumes the image's pyarrow>=24 (datasets 5.2's floor; the image's version is not known, and
  # pyarrow's ~42 MiB does not fit beside Ray). If the install says otherwise, put the image's version in
  # image_packages.txt (pyarrow==X): the resolution then picks a datasets that accepts it.
  python3 tests/gpu/bundle.py --python "${BUNDLE_PYTHON:-3.12}" --have "${BUNDLE_HAVE:-tests/gpu/image_packages.txt}" \
    --out "$BUNDLE" && echo "carry .gpu-bundle to the GPU machine (run's carry: [\".gpu-bundle\"]) and run: bash tests/gpu/run.sh"
}
[ "${1:-}" = "--prepare" ] && { prepare; exit; }

OUT=${OUT:-outputs/gpu_check}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
ROWS=()
export OMP_WAIT_POLICY=PASSIVE RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
record() { ROWS+=("$(printf '%-26s %-6s %s' "$1" "$2" "$3")"); }
row() {  # row NAME SECONDS COMMAND...: run with a time limit, record PASS/FAIL with pytest's summary if any
  local name=$1 limit=$2; shift 2
  if [ -n "${GPU_LINES:-}" ] && ! [[ "$name" =~ $GPU_LINES|install|sync ]]; then skip "$name" "not in GPU_LINES"; return; fi
  local log="$LOGS/${name//[^a-z0-9]/_}.log" start=$SECONDS rc
  timeout "$limit" "$@" >"$log" 2>&1; rc=$?
  local summary; summary=$(grep -aoE '[0-9]+ (passed|failed|skipped|errors?|deselected)(, [0-9]+ [a-z]+)*' "$log" | tail -1)
  local figures; figures=$(grep -a '^FIGURES: ' "$log" | tail -1); summary=${figures:+${figures#FIGURES: }}${summary}
  if [ $rc -eq 0 ]; then status="PASS${summary:+ ($summary)}"
  elif [ $rc -eq 5 ]; then status="SKIP (no test selected)"
  elif [ $rc -eq 124 ]; then status="FAIL (timed out after ${limit}s)"
  else status="FAIL (rc $rc${summary:+, $summary})"; fi
  record "$name" "$((SECONDS - start))s" "$status"
  { echo "===== $name: $status"; cat "$log"; } >>"$LOGS/all.log"
}
skip() { record "$1" "-" "SKIP ($2)"; }

# ---- environment ------------------------------------------------------------------------------------------------
if ! nvidia-smi -L >/dev/null 2>&1; then
  PY=(python3)  # no GPU: install nothing; the probe below says what this machine has
  command -v uv >/dev/null && [ -d .venv ] && PY=(uv run --no-sync python)
elif [ -f "$BUNDLE" ]; then
  SITE=/tmp/roll-gpu/site-packages
  row "install bundle" 180 bash tests/gpu/install_bundle.sh python3 "$BUNDLE" "$SITE"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  PY=(python3)
elif command -v uv >/dev/null && [ -f uv.lock ]; then
  [ -z "${ROLL_GPU_SKIP_SYNC:-}" ] && row "sync megatron env" 420 uv sync --extra megatron
  PY=(uv run --no-sync python)
else
  PY=(python3)
fi
PROBE=$(cat <<'PY'
import importlib.util as u, torch
stacks = [f"{m} {'yes' if u.find_spec(m) else 'no'}" for m in ("megatron", "ray", "vllm")]
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "gpus", torch.cuda.device_count(), *stacks)
PY
)
INFO=$("${PY[@]}" -c "$PROBE" 2>&1 | tail -1)
record "environment" "-" "$INFO"
has() { case "$INFO" in *"$1 yes"*) return 0 ;; *) return 1 ;; esac; }
GPUS=$(sed -nE 's/.*gpus ([0-9]+).*/\1/p' <<<"$INFO"); GPUS=${GPUS:-0}
PYTEST=("${PY[@]}" -m pytest -q -m gpu -p no:cacheprovider -p roll.core.testing --noconftest)
# --noconftest: tests/workers/conftest.py builds Ray clusters at import; the gpu tests need no conftest fixture.
# roll.core.testing is loaded as a plugin instead (the gpu marker and its skip reason).
MEGATRON_FILES=(tests/workers/test_gpu_strategies.py tests/workers/test_megatron_heads.py
  tests/workers/test_megatron_wiring.py tests/pipelines/test_megatron_roles.py)

if [[ "$INFO" != *"cuda True"* ]]; then
  why="no CUDA device: torch.cuda.is_available() is False"
  nvidia-smi -L >/dev/null 2>&1 || why="no GPU: nvidia-smi lists none"
  for name in "megatron tp=1 (3 roles)" "megatron tp2 vs tp1" "cuda batch, rng, ipc" "vllm gpu tests" \
    "bf16 matmul peak" "rlvr hf+fsdp2 hybrid bf16" "sft megatron tp=1" "rlvr vllm+fsdp2 colocated"; do skip "$name" "$why"; done
else
  # ---- Megatron ---------------------------------------------------------------------------------------------------
  if has megatron; then
    row "megatron tp=1 (3 roles)" 300 "${PYTEST[@]}" "${MEGATRON_FILES[@]}" -k "megatron and not tp2"
    if [ "$GPUS" -ge 2 ]; then
      row "megatron tp2 vs tp1" 300 "${PYTEST[@]}" "${MEGATRON_FILES[@]}" -k tp2
    else
      skip "megatron tp2 vs tp1" "needs 2 GPUs, found $GPUS"
    fi
  else
    skip "megatron tp=1 (3 roles)" "megatron-core does not import (run --prepare and carry .gpu-bundle)"
    skip "megatron tp2 vs tp1" "megatron-core does not import"
  fi
  row "cuda batch, rng, ipc" 120 "${PYTEST[@]}" tests/core/test_batch.py tests/core/test_checkpoint.py \
    tests/workers/test_update_paths.py
  # ---- vLLM and the pipeline runs -----------------------------------------------------------------------------
  if has vllm; then
    row "vllm gpu tests" 300 "${PYTEST[@]}" tests/workers/test_gpu_strategies.py tests/workers/test_vision.py -k vllm
  else
    skip "vllm gpu tests" "vllm is not installed (not in the device image; its wheels are far over 64 MiB)"
  fi
  no_ray="Ray does not import (run --prepare and carry .gpu-bundle)"
  row "bf16 matmul peak" 120 "${PY[@]}" tests/gpu/perf.py peak "$LOGS/peak.json"
  if has ray && [ -f "$LOGS/peak.json" ]; then
    row "rlvr hf+fsdp2 hybrid bf16" 480 "${PY[@]}" tests/gpu/perf.py rlvr "$LOGS/peak.json" outputs/gpu_rlvr_hybrid
  else
    skip "rlvr hf+fsdp2 hybrid bf16" "$(has ray && echo "no bf16 peak measured" || echo "$no_ray")"
  fi
  if has ray && has megatron; then
    row "sft megatron tp=1" 300 bash -c "
      rm -rf outputs/gpu_sft_megatron && ${PY[*]} -m roll.core.cli train tests/gpu/sft_megatron.yaml &&
      ${PY[*]} - <<'PY'
import json
from transformers import AutoModelForCausalLM
rows = [json.loads(l)['metrics'] for l in open('outputs/gpu_sft_megatron/metrics.jsonl')]
loss = [r['train/loss'] for r in rows if 'train/loss' in r]
print('loss first -> last', loss[0], loss[-1]); assert loss[-1] < loss[0]
AutoModelForCausalLM.from_pretrained('outputs/gpu_sft_megatron/hf'); print('export loads')
PY"
  else
    skip "sft megatron tp=1" "$(has ray && echo "megatron-core does not import" || echo "$no_ray")"
  fi
  if has ray && has vllm; then
    row "rlvr vllm+fsdp2 colocated" 300 bash -c "
      rm -rf outputs/gpu_rlvr && ${PY[*]} -m roll.core.cli train examples/quickstart.yaml max_steps=4 placement=separate \
        warmup.steps=10 eval_every=0 ray.num_cpus=8 ray.num_gpus=1 actor_train.gpus_per_worker=1 \
        actor_train.device_group=gpu0 actor_infer.gpus_per_worker=1 actor_infer.device_group=gpu0 \
        actor_infer.strategy.type=vllm actor_infer.strategy.gpu_memory_utilization=0.3 \
        actor_infer.strategy.sleep_level=2 'tracking.backends=[jsonl]' output_dir=outputs/gpu_rlvr &&
      ${PY[*]} - <<'PY'
import json
rows = [json.loads(l)['metrics'] for l in open('outputs/gpu_rlvr/metrics.jsonl')]
steps = [r for r in rows if 'policy_version' in r]
versions = [r['policy_version'] for r in steps]
print('versions', versions)
assert len(steps) == 4 and versions == sorted(set(versions))
for r in steps:
    keys = {k: round(v, 3) for k, v in r.items() if k.startswith('colocate/')}
    print(keys)
    assert {'colocate/actor_train_offload_s', 'colocate/actor_infer_reload_s'} <= set(keys)
    assert r['colocate/actor_train_freed_mib'] > 0 and r['colocate/actor_infer_freed_mib'] > 0
PY"
  else
    skip "rlvr vllm+fsdp2 colocated" "$(has ray && echo "vllm is not installed" || echo "$no_ray")"
  fi
fi

NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
  echo
  echo "roll GPU check on ${NAME:-no GPU} x $GPUS"
  printf '%-26s %-6s %s\n' check time result
  for r in "${ROWS[@]}"; do echo "$r"; done
} | tee "$OUT/gpu_table.txt"
cat "$LOGS"/all.log >"$OUT/gpu_check.log" 2>/dev/null || : >"$OUT/gpu_check.log"
rm -rf "$LOGS"
! printf '%s\n' "${ROWS[@]}" | grep -q FAIL
