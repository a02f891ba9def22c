"""The adversarial tests use the same real pieces as the integration tests: anvil with the compiled
contracts, the tiny model, a real vLLM engine and the validator's transformers prefill."""

from tests.integration.conftest import hf_prefill, tiny_model, tiny_model_other, vllm_engine

__all__ = ["hf_prefill", "tiny_model", "tiny_model_other", "vllm_engine"]
