"""The PyTriton servers (reward and critic, wire-compatible with NeMo-Aligner) and how a run starts and stops them."""
