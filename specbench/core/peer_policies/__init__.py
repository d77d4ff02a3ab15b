"""Other engines' draft-length policies as specbench policies, one module each with its source named:
vLLM's batch-size table, SGLang's EMA tiers, ollama's expected-tokens-per-cost controller and a
confidence threshold (llama.cpp, DSpark, EAGLE style). Each is a ``DraftPolicy``, built by name through
``DraftPolicy.parse`` (each module registers its own in ``specbench.core.policies.PEERS``) or its class.
"""

from specbench.core.peer_policies.ollama import OllamaControllerPolicy
from specbench.core.peer_policies.sglang import SglangEmaPolicy
from specbench.core.peer_policies.threshold import ConfidencePolicy
from specbench.core.peer_policies.vllm import VllmTablePolicy

__all__ = ["ConfidencePolicy", "OllamaControllerPolicy", "SglangEmaPolicy", "VllmTablePolicy"]
