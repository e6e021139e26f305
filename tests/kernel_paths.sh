#!/usr/bin/env bash
# The numeric tests (those comparing floats computed along two paths: ranks, engines, kernels,
# merged or not, streamed or whole, ours or a peer's; docs/numerics.md lists them) under other CPU kernel paths of this machine,
# standing in for another CPU's: ATen's vectorised kernels (ATEN_CPU_CAPABILITY), oneDNN's
# (ONEDNN_MAX_CPU_ISA) and MKL's GEMM (MKL_CBWR=COMPATIBLE, its generic code path: MKL picks its
# GEMM kernels by CPU vendor and model, which none of the other settings reach). `make test-kernels`;
# KERNEL_PATHS and KERNEL_TESTS narrow it. A report per setting goes to .cache/kernel-paths/.
set -uo pipefail
cd "$(dirname "$0")/.."
settings=${KERNEL_PATHS:-"as-is MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX512_CORE"}
la=tests/test_learner_actor.py lo=tests/test_lora.py rp=tests/test_rollout_parity.py
tests=${KERNEL_TESTS:-"tests/test_learner_math.py tests/test_chunked_logprobs.py tests/test_trl_peer.py tests/test_rounding.py
    tests/test_shared_prefixes.py $la::test_gradient_checkpointing_takes_the_same_step
    $la::test_zero_stage_trains_and_publishes_whole_weights $la::test_one_mini_batch_takes_its_step_start_logprobs_from_the_training_forward
    $la::test_two_ranks_zero2_match_one_rank $la::test_a_step_streamed_in_parts_takes_the_step_of_the_whole_batch
    $lo::test_the_merged_weights_are_the_adapted_model $lo::test_vllm_with_the_pushed_adapter_matches_transformers_with_the_merged_weights
    $lo::test_the_learner_trains_only_the_adapter_its_reference_is_the_base_and_it_resumes $lo::test_a_restarted_engine_gets_the_adapters_base_then_the_adapter
    $rp::test_vllm_matches_transformers_after_each_update $rp::test_both_engines_take_a_prompt_as_token_ids $rp::test_vllm_logprobs_match_the_learners
    $rp::test_a_push_during_a_long_generation_lands_between_decoding_steps $rp::test_generation_calls_side_by_side_share_one_engine
    tests/test_weight_sync_shm.py::test_auto_is_shm_for_vllm_and_gloo_for_the_rest_and_gloo_when_forced"}
mkdir -p .cache/kernel-paths
failed=()
for setting in $settings; do
    report=.cache/kernel-paths/${setting//[=\/]/-}.txt
    # torch's compiled-kernel cache (vLLM's sampler) is not keyed by ATEN_CPU_CAPABILITY: a kernel
    # built for AVX-512 fails to compile under `default`. One cache per setting.
    env=("TORCHINDUCTOR_CACHE_DIR=$PWD/.cache/kernel-paths/inductor-${setting//[=\/]/-}"); [[ $setting != as-is ]] && env+=("$setting")
    echo "== $setting (report: $report)"
    if env "${env[@]}" .venv/bin/python -m pytest -q -p no:cacheprovider $tests >"$report" 2>&1; then
        tail -1 "$report"
    else
        tail -1 "$report"; grep '^FAILED\|^ERROR' "$report"; failed+=("$setting")
    fi
done
((${#failed[@]} == 0)) || { echo "red under: ${failed[*]}"; exit 1; }
