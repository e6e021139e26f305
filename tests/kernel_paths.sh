#!/usr/bin/env bash
# The numeric tests (those comparing floats computed along two paths: ranks, engines, kernels,
# merged or not, streamed or whole, ours or a peer's) under other CPU kernel paths of this machine,
# standing in for another CPU's: ATen's vectorised kernels (ATEN_CPU_CAPABILITY), oneDNN's
# (ONEDNN_MAX_CPU_ISA) and MKL's GEMM (MKL_CBWR=COMPATIBLE, its generic code path: MKL picks its
# GEMM kernels by CPU vendor and model, which none of the other settings reach). `make test-kernels`;
# KERNEL_PATHS and KERNEL_TESTS narrow it. A report per setting goes to .cache/kernel-paths/.
set -uo pipefail
cd "$(dirname "$0")/.."
settings=${KERNEL_PATHS:-"as-is ATEN_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX512_CORE MKL_CBWR=COMPATIBLE"}
tests=${KERNEL_TESTS:-"tests/test_learner_actor.py tests/test_learner_math.py tests/test_chunked_logprobs.py tests/test_shared_prefixes.py tests/test_lora.py tests/test_rollout_parity.py tests/test_weight_sync_shm.py tests/test_trl_peer.py"}
mkdir -p .cache/kernel-paths
failed=()
for setting in $settings; do
    report=.cache/kernel-paths/${setting//[=\/]/-}.txt
    env=(); [[ $setting != as-is ]] && env=("$setting")
    echo "== $setting (report: $report)"
    if env "${env[@]}" .venv/bin/python -m pytest -q -p no:cacheprovider $tests >"$report" 2>&1; then
        tail -1 "$report"
    else
        tail -1 "$report"; grep '^FAILED\|^ERROR' "$report"; failed+=("$setting")
    fi
done
((${#failed[@]} == 0)) || { echo "red under: ${failed[*]}"; exit 1; }
