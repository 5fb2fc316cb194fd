"""Models: device and dtype, Hugging Face folders, batches and log-probs, the reference policy, Llama kernels,
LoRA, the Megatron-Core backend and GGUF import.
"""
