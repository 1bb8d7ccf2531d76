"""pacer inside other serving engines. Each integration imports its engine only when it is used, never when
pacer is imported: :mod:`pacer.integrations.vllm` (a vLLM ``custom_class`` speculative proposer, docs/vllm.md)."""
