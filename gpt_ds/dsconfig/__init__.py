"""The DeepSpeed config: schema and presets, RunSettings, filling "auto" (batch, precision,
optimizer, schedule).
"""
