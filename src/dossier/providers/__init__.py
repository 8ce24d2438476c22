"""Adapters to models: embeddings (local ONNX, sentence-transformers, OpenAI-compatible) and, later,
chat and rerank. Vendor imports are guarded; a missing extra raises :class:`~dossier.errors.MissingExtra`."""
