"""Memory and communication model for GPT-2 under DeepSpeed ZeRO (0.19), and the preset picker.

Dependencies flow down this list, and nothing here imports the trainer; import each name from
the module that defines it (the package imports nothing, so a run loads no picker):

* `estimate`: the model's pieces (`ZeroSettings`, the zero_optimization sizes that cost memory;
  `DeepSpeedRun`, the rest of a run that does; GPT-2's parameter layout and ZeRO's partition of
  it; the activations autograd keeps; the bytes each GPU sends per step) and `estimate_run` ->
  `MemoryEstimate`, per GPU and per node's CPU: the trainer's start-up estimate.
* `measure`: `measured_model_state_bytes` of a live engine, through DeepSpeed's internals.
* `hardware`: `Hardware`, the cluster a plan is for, and how much of its memory a plan may use.
* `guard`: the start-up refusal of a run that cannot fit.
* `picker`: the candidates (the ds_configs/ presets, resolved as the trainer resolves them),
  `choose_preset` -> `PresetChoice` (fit, batch split, traffic, time, recommendation).
* `choice_text`: `format_choice`, a choice as the text `tools/pick_preset.py` prints.
"""
