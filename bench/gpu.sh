#!/usr/bin/env bash
# The GPU set, in one short run on a CUDA machine (target: under 6 minutes on one H200):
#   1. the sampler tests (both decode paths, CUDA graphs) on CUDA
#   2. sampler throughput, qwen2-0.5b shape, bf16: 64x128 and 256x256, hf (graphs + fused forward, projections
#      packed) vs the same unpacked vs graphs over the model's own forward vs dynamic vs model.generate
#   3. where a graph step's time goes (decode_profile.py), fused forward and model forward
#   4. one GRPO step rlcore vs TRL 1.16, qwen2-0.5b shape, 8 prompts x 8 x 256 tokens, fp32 then bf16
#   5. the trainer / algorithms tests on CUDA
#   6. padding-free micro-batches vs padded (bench/padding_free.py), qwen2-0.5b shape, bf16, 64 rows of a
#      GSM8K-like spread: step time and peak memory; flash-attention's one-row path too where flash_attn imports
# Every stage has its own time limit and the whole script a deadline (stages that would start past
# it are skipped and say so); results go to $OUT (or bench/results/gpu), a summary is printed last.
#
#   bash bench/gpu.sh                 # from the repository root, rlcore importable
#   WHEELS=../.whl bash bench/gpu.sh  # a bare machine: install trl/datasets/... from carried wheels first
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
DEADLINE=${GPU_SH_SECONDS:-360}
START=$(date +%s)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export RLCORE_CACHE=${RLCORE_CACHE:-/tmp/rlcore-cache}

if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || echo "wheel install failed"
  mkdir -p /tmp/rlpath && ln -sfn "$PWD/core" /tmp/rlpath/rlcore
  export PYTHONPATH=/tmp/rlpath:/tmp/site:${PYTHONPATH:-}
fi
python3 - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for m in ("transformers", "trl", "datasets", "peft", "accelerate", "huggingface_hub", "rlcore"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as exc:
        print(m, "MISSING", type(exc).__name__, exc)
EOF
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null

declare -a SUMMARY
stage() {  # stage NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - ($(date +%s) - START)))
  if [ "$left" -lt 20 ]; then SUMMARY+=("$name: SKIPPED (deadline)"); echo "== $name: skipped, ${left}s left"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@"
  local rc=$?
  SUMMARY+=("$name: rc=$rc in $(($(date +%s) - t0))s")
}

# only the plugins these tests need: the image's other pytest plugins need not match the carried pytest
PYTEST="env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -q -p pytest_asyncio.plugin -p pytest_timeout --timeout 90"
stage "sampler tests (cuda)" 100 $PYTEST tests/test_sampling_hf_static.py tests/test_sampling_hf_fused.py \
  tests/test_sampling_hf.py tests/test_sampling_processing.py
stage "sampler throughput" 180 python3 bench/sampler_throughput.py --sizes qwen2-0.5b --device cuda --dtype bfloat16 \
  --work 64x128 256x256 --modes batched static_unpacked static_model dynamic generate --repeats 2 \
  --out "$OUT/sampler_throughput_gpu"
stage "decode profile" 60 python3 bench/decode_profile.py --shape qwen2-0.5b --dtype bfloat16 --buckets 64 256 --out "$OUT/decode_profile_gpu"
GRPO="python3 bench/grpo_step.py --shape qwen2-0.5b --prompts 8 --num-generations 8 --max-completion-length 256 --steps 2 --warmup 1"
stage "grpo step fp32" 80 $GRPO --out "$OUT/grpo_step_gpu_fp32"
stage "grpo step bf16" 80 $GRPO --bf16 --out "$OUT/grpo_step_gpu_bf16"
stage "trainer/algorithms tests (cuda)" 90 $PYTEST tests/test_trainer.py tests/test_algorithms_is_correction.py \
  tests/test_algorithms_logprobs.py tests/test_losses.py tests/test_advantages.py \
  tests/test_trainer_sleep.py::test_hf_sampler_sleeps_through_every_training_step_and_no_number_changes
PF="python3 bench/padding_free.py --device cuda --dtype bfloat16 --models qwen2-0.5b --rows 64 --micro 4 --repeats 2 --modes padded row_packed padding_free"
stage "padding-free step (sdpa)" 90 $PF --out "$OUT/padding_free_gpu"
if python3 -c "import flash_attn" 2>/dev/null; then
  stage "padding-free step (flash-attention 2)" 90 $PF --attn flash_attention_2 --out "$OUT/padding_free_gpu_fa2"
else
  SUMMARY+=("padding-free step (flash-attention 2): SKIPPED (flash_attn is not installed)")
fi

echo "================ summary ($(($(date +%s) - START))s)"
printf '%s\n' "${SUMMARY[@]}"
python3 - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("sampler_throughput_gpu.json",):
    p = out / name
    for r in (json.loads(p.read_text())["results"] if p.exists() else []):
        print(f"sampler {r['concurrency']}x{r['max_tokens']} {r['mode']:>9}: " + (f"{r['tokens_per_s']:>9.0f} tok/s {r.get('runs_tokens_per_s', '')} kv read {r.get('kv_read_fraction', '-')}" if "tokens_per_s" in r else r.get("error", "")))
p = out / "decode_profile_gpu.json"
for r in (json.loads(p.read_text())["rows"] if p.exists() else []):
    print(f"decode {r['forward']:>5} forward, {r['bucket']:>3} rows: replay {r['replay_ms']:.3f} ms/step, end-to-end {r['end_to_end_tok_s']:>8.0f} tok/s")
for prec in ("fp32", "bf16"):
    p = out / f"grpo_step_gpu_{prec}.json"
    if p.exists():
        r = json.loads(p.read_text())
        print(f"grpo {prec}: rlcore {r['median_step_s']['rlcore']:.2f}s (rollout {r['rlcore_median_rollout_s']}) TRL {r['median_step_s']['trl']:.2f}s ratio {r['ratio']:.3f}")
for name in ("padding_free_gpu", "padding_free_gpu_fa2"):
    p = out / f"{name}.json"
    for model, rows in (json.loads(p.read_text())["results"].items() if p.exists() else []):
        for r in rows:
            print(f"{name} {model} {r['mode']:>12}: " + (r["error"] if "error" in r else f"{r['step_s']:.3f} s/step, peak {r['peak_mib']:.0f} MiB, x{r.get('time_ratio', 0):.2f} time, x{r.get('memory_ratio') or 0:.2f} memory vs padded"))
EOF
