"""Model building and inference engines.

`models` builds or converts the models a node runs (a tiny random Llama for tests, SmolLM2-135M-Instruct
for the devnet) into plain local safetensors folders, so nothing is fetched from a hub at run time.
`engine` wraps vLLM for the worker's rollouts (with the final hidden states TOPLOC proofs need, captured
by `capture`), `hf` is plain transformers for the validator's prefill, `types` what they exchange, and
`tools` a model's tokenizer tools for every role. `models` alone stays cheap to import.
"""

from node.inference.models import build_tiny_model, ensure_model, smollm2_model

__all__ = ["build_tiny_model", "ensure_model", "smollm2_model"]
