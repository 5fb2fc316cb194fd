"""Sampling responses from the policy: the generator, the Llama decode step with its KV cache, and token sampling."""
