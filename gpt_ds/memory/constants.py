"""Units shared by the memory model, the communication model and the preset picker."""

GiB = 2**30
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
