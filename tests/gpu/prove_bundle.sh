#!/usr/bin/env bash
# Prove the GPU bundle's path on this CPU box: a bare venv playing the GPU image, the network cut, pip --no-index.
#
#   bash tests/gpu/prove_bundle.sh        (needs PyPI for steps 1-2 and root for `unshare -n`; ~10 min on 2 cores)
#
# 1. a bare venv (PROOF_PYTHON, default python3.11) with only torch (2.13.0, the file on this disk) and uv.lock's
#    transformers, and what those two need; its `pip freeze` stands for the GPU image's package list;
# 2. tests/gpu/bundle.py builds the bundle for that Python, as `run.sh --prepare` does for the image's 3.12;
# 3. in a new network namespace (`unshare -n`: only a loopback, no route out; shown by a refused connection),
#    tests/gpu/install_bundle.sh installs it with pip --no-index beside the venv's packages, Ray starts from it and
#    runs a task, and the CPU quickstart runs PROOF_STEPS RL steps (after a short warm-up) from the installed wheels.
# Too slow for CI (the download and xz alone take minutes); the lead runs it by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
WORK=${WORK:-/tmp/roll-bundle-proof}
PROOF_PYTHON=${PROOF_PYTHON:-python3.11}
STEPS=${PROOF_STEPS:-3}
TRANSFORMERS=$(uv export --frozen --no-dev --no-hashes --package roll-data | grep '^transformers==')
say() { printf '\n==== %s\n' "$*"; }

if [ -n "${PROOF_REUSE:-}" ] && [ -x "$WORK/venv/bin/python" ] && compgen -G "$WORK/*.tar.xz" >/dev/null; then
  echo "PROOF_REUSE: steps 1-2 done before, reusing $WORK's venv and bundle"
  VPY=$WORK/venv/bin/python
  PYV=$("$VPY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
else
say "1. bare venv: only torch and transformers ($PROOF_PYTHON)"
rm -rf "$WORK" && mkdir -p "$WORK"
"$PROOF_PYTHON" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
"$VPY" -m pip install -q torch==2.13.0 "$TRANSFORMERS"
"$VPY" -m pip freeze >"$WORK/have.txt"
"$VPY" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
echo "$(wc -l <"$WORK/have.txt") packages in the venv: $(tr '\n' ' ' <"$WORK/have.txt")"
PYV=$("$VPY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

say "2. build the bundle for CPython $PYV"
# xz preset 3 (9 for the real one): the same format, minutes sooner on a busy 2-core box for a bundle that
# also carries pyarrow, pandas and matplotlib, which a bare venv lacks and the GPU image has.
python3 tests/gpu/bundle.py --python "$PYV" --have "$WORK/have.txt" --limit-mib 400 --xz-preset 3 \
  --out "$WORK/roll-gpu-bundle-cp${PYV/./}.tar.xz"
fi

say "3. network off: install with pip --no-index, start Ray, run the CPU quickstart for $STEPS steps"
export WORK VPY REPO STEPS BUNDLE="$WORK/roll-gpu-bundle-cp${PYV/./}.tar.xz"
unshare -n bash -euo pipefail <<'OFFLINE'
ip link set lo up
echo "interfaces: $(ip -brief link | awk '{print $1, $2}' | tr '\n' ' ')"
"$VPY" - <<'PY'
import socket
try:
    socket.create_connection(("151.101.0.223", 443), timeout=5)  # pypi.org's address, no DNS needed
    raise SystemExit("the network is reachable: this is no offline proof")
except OSError as e:
    print(f"network off: connecting to PyPI's address fails: {e}")
PY
time bash "$REPO/tests/gpu/install_bundle.sh" "$VPY" "$BUNDLE" "$WORK/site-packages"
export PYTHONPATH=$WORK/site-packages OMP_WAIT_POLICY=PASSIVE RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$WORK"  # not the repository: every roll module must come from the installed wheels
"$VPY" - <<'PY'
import ray, roll.core, roll.pipelines, megatron.core
for m in (ray, roll.core, roll.pipelines, megatron.core):
    print(f"{m.__name__} from {list(m.__path__)[0]}")
ray.init(num_cpus=2, include_dashboard=False)
print("ray", ray.__version__, "started:", ray.cluster_resources())
print("a remote task says:", ray.get(ray.remote(lambda: "hello from a Ray worker").remote()))
ray.shutdown()
PY
time "$VPY" -m roll.core.cli train "$REPO/examples/quickstart.yaml" max_steps="$STEPS" warmup.steps=20 eval_every=0 \
  'tracking.backends=[stdout,jsonl]' output_dir="$WORK/quickstart"
"$VPY" - <<'PY'
import json, os
rows = [json.loads(l)["metrics"] for l in open(os.environ["WORK"] + "/quickstart/metrics.jsonl")]
steps = [r for r in rows if "policy_version" in r]
for r in steps:
    print({k: round(r[k], 3) for k in ("policy_version", "time/step_s", "reward/arithmetic/mean", "actor/loss") if k in r})
assert len(steps) == int(os.environ["STEPS"]), f"{len(steps)} RL steps logged, expected {os.environ['STEPS']}"
print(f"OK: {len(steps)} RL steps ran offline from the bundle")
PY
OFFLINE
