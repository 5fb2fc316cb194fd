"""Flask REST API and Gradio UI (the training-service and dashboard issues)."""
