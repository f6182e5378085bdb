"""The trainer: engine build, the loop, evaluation, compile, stop signals and early stopping."""
