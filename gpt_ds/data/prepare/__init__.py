"""Text, JSONL, Parquet/Arrow and Hugging Face datasets to token files, in parallel chunks."""
