"""GPT-2: shapes and presets, construction (partitioned under ZeRO-3), the chunked LM loss."""
