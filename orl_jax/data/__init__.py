"""Tasks, tokenizers and grain pipelines."""
