"""GPT-2: shapes and presets, construction (partitioned under ZeRO-3), the LM loss by kind."""
