"""Probes of trained models: our checkpoints and Hugging Face models."""
