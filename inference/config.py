"""Engine settings. Nested into the root settings tree (``gateway.config.Settings.inference``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from inference.pbs_attn.config import PBSSettings


class InferenceSettings(BaseModel):
    """How the in-process vLLM engine is built. Every field maps onto a vLLM engine argument or env var."""

    model: str | None = Field(
        default=None,
        description="Hugging Face model id or local folder; empty = the embedded SmolLM2-135M-Instruct.",
    )
    served_model_name: str | None = Field(default=None, description="Id clients pass as `model` (default: derived).")
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int = Field(default=2048, ge=16)
    max_num_seqs: int = Field(default=64, ge=1)
    kv_cache_gib: float = Field(default=1.0, gt=0, description="KV-cache size on CPU (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: Literal["mp", "ray", "uni"] | None = None
    enforce_eager: bool = Field(default=True, description="CUDA graphs / torch.compile off: fast start, hooks stay live.")
    enable_prefix_caching: bool | None = None
    multiprocessing: bool = Field(
        default=True, description="Engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING); off = seconds to start."
    )
    cpu_threads_bind: str = Field(default="auto", description="VLLM_CPU_OMP_THREADS_BIND on CPU.")
    torch_threads: int | None = Field(default=None, ge=1, description="torch threads in this process (None = leave).")
    seed: int = 0
    chunked_prefill: bool | None = Field(
        default=None,
        description=(
            "Split long prefills across engine steps. None = off on CPU, on elsewhere: vLLM 0.32's CPU runner "
            "rewinds a seeded request's generator after a partial prefill with an offset CPU generators do not "
            "have, which kills the engine."
        ),
    )
    log_stats: bool = Field(default=True, description="Keep vLLM's `vllm:*` Prometheus metrics.")
    tool_call_parser: str = Field(
        default="hermes",
        description=(
            "vLLM tool parser (as vLLM's --tool-call-parser) that reads the model's tool calls back out of its "
            "text; a chat template without tool support is shown the tools in the Hermes format, which 'hermes' reads."
        ),
    )
    pbs: PBSSettings = Field(default_factory=PBSSettings, description="Prefill attention: dense or PBS-Attn.")

    @field_validator("model")
    @classmethod
    def _empty_is_default(cls, v: str | None) -> str | None:
        return v or None
