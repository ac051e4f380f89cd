"""Files in, a ModelSpec, a Hugging Face-named state dict and a tokenizer out. Knows nothing of HTTP."""

from prefill.loading.resolve import LoadedModel, default_model_path, load_model_files

__all__ = ["LoadedModel", "default_model_path", "load_model_files"]
