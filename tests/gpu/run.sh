#!/usr/bin/env bash
# One prepared GPU check for roll (issue 14), inside 10 minutes on one H100/H200-class GPU.
#
# Usage: bash tests/gpu/run.sh            (from the repository root; needs uv, CUDA and PyPI access)
#        ROLL_GPU_SKIP_SYNC=1 bash tests/gpu/run.sh   (offline: reuse .venv and .venv-vllm as they are)
#
# It builds two environments, because vllm pins its own torch (see [tool.uv] conflicts in pyproject.toml):
#   .venv          uv sync --extra megatron          (dev group: pytest)  -> Megatron lines and the other gpu tests
#   .venv-vllm     uv sync --no-dev --extra vllm      (+ pytest)           -> vLLM lines
# and prints one table, one line per check. What each line proves:
#
#   gpu tests (megatron env)  every @pytest.mark.gpu test outside the vLLM file passes or skips with its reason:
#                             Megatron TP=1 lowers a batch's loss and its HF export scores like the trainer; CUDA IPC
#                             opens a shared bucket in another process; TP=2 vs TP=1 skips unless two GPUs exist
#   gpu tests (vllm env)      vLLM: n samples with log-probs matching an fp32 HF forward, sleep frees memory and
#                             wake restores outputs, a weight update equals loading those weights, LoRA serves the
#                             merged model
#   rlvr vllm+fsdp2 colocated the quickstart with actor_train (fsdp2) and actor_infer (vllm, sleep level 2) on one GPU
#                             in one device_group: it trains, the policy version advances with every step, and every
#                             step logs colocate/*_offload_s, *_reload_s and *_freed_mib (memory really freed: > 0)
#   sft megatron tp=1         SFT on Megatron-Core through the pipeline (MP_SPLIT dispatch, checkpoint, HF export):
#                             the loss falls and the exported folder loads with transformers
#   megatron tp2 vs tp1       (two GPUs only) TP=2 gives TP=1's log-probs, loss, grad norm and updated weights on one
#                             batch (tests/workers/test_megatron_wiring.py::test_megatron_tp2_matches_tp1_on_one_batch)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-outputs/gpu_check}
mkdir -p "$OUT"
ROWS=()
row() {  # row NAME COMMAND...: run, time, record PASS/FAIL (the log is $OUT/NAME.log)
  local name=$1; shift
  local log="$OUT/${name// /_}.log" start=$SECONDS
  if timeout 420 "$@" >"$log" 2>&1; then status=PASS; else status="FAIL (rc $?, see $log)"; fi
  ROWS+=("$(printf '%-28s %-6ss %s' "$name" "$((SECONDS - start))" "$status")")
  tail -3 "$log"
}
export OMP_WAIT_POLICY=PASSIVE RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)

# ---- Megatron environment ----------------------------------------------------------------------------------
[ -z "${ROLL_GPU_SKIP_SYNC:-}" ] && row "sync megatron env" uv sync --extra megatron
export UV_NO_SYNC=1  # uv run must not re-sync the environment the line above made
row "gpu tests (megatron env)" uv run pytest -q -m gpu tests --ignore=tests/workers/test_gpu_strategies.py -k "not vllm" -p no:cacheprovider
row "gpu tests megatron file" uv run pytest -q -m gpu tests/workers/test_gpu_strategies.py -k megatron -p no:cacheprovider
row "sft megatron tp=1" bash -c "
  rm -rf outputs/gpu_sft_megatron && uv run roll train tests/gpu/sft_megatron.yaml &&
  uv run python - <<'PY'
import json
from transformers import AutoModelForCausalLM
rows = [json.loads(l)['metrics'] for l in open('outputs/gpu_sft_megatron/metrics.jsonl')]
loss = [r['train/loss'] for r in rows if 'train/loss' in r]
print('loss first -> last', loss[0], loss[-1]); assert loss[-1] < loss[0]
AutoModelForCausalLM.from_pretrained('outputs/gpu_sft_megatron/hf'); print('export loads')
PY"
if [ "$GPUS" -ge 2 ]; then
  row "megatron tp2 vs tp1" uv run pytest -q -m gpu "tests/workers/test_megatron_wiring.py::test_megatron_tp2_matches_tp1_on_one_batch"
else
  ROWS+=("$(printf '%-28s %-6s %s' "megatron tp2 vs tp1" "-" "SKIP (needs 2 GPUs, found $GPUS)")")
fi

# ---- vLLM environment --------------------------------------------------------------------------------------
VENV=.venv-vllm
[ -z "${ROLL_GPU_SKIP_SYNC:-}" ] && row "sync vllm env" bash -c "UV_PROJECT_ENVIRONMENT=$VENV uv sync --no-dev --extra vllm && uv pip install --python $VENV/bin/python -q pytest pytest-timeout"
row "gpu tests (vllm env)" "$VENV/bin/python" -m pytest -q -m gpu tests/workers/test_gpu_strategies.py -k vllm -p no:cacheprovider
row "rlvr vllm+fsdp2 colocated" bash -c "
  rm -rf outputs/gpu_rlvr && $VENV/bin/roll train examples/quickstart.yaml max_steps=4 warmup.steps=10 eval_every=0 \
    ray.num_cpus=8 ray.num_gpus=1 actor_train.gpus_per_worker=1 actor_train.device_group=gpu0 \
    actor_infer.gpus_per_worker=1 actor_infer.device_group=gpu0 actor_infer.strategy.type=vllm \
    actor_infer.strategy.gpu_memory_utilization=0.3 actor_infer.strategy.sleep_level=2 \
    'tracking.backends=[jsonl]' output_dir=outputs/gpu_rlvr &&
  $VENV/bin/python - <<'PY'
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

echo
echo "roll GPU check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x $GPUS"
printf '%-28s %-7s %s\n' check time result
for r in "${ROWS[@]}"; do echo "$r"; done
! printf '%s\n' "${ROWS[@]}" | grep -q FAIL
