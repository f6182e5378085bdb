"""The run config (the training CLI) and what it resolves to: run length, the weights to start
from, the out-dir lock.
"""
