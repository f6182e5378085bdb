"""Names in gpt_ds/ that vulture reports unused but something outside Python's own calls reads:
the dead-code check (tests/test_lint.py) passes this file to vulture beside gpt_ds/, benchmarks/
and tools/. Each line says who reads the name; add one only with that reason."""

DataclassInstance  # typing-only import, read by the annotations (base/cli.py)
option_string  # argparse.Action.__call__'s signature (base/cli.py)
format_version  # a Manifest field: written to and read from gpt_ds.json by dataclasses
saved_at  # a Manifest field: written to gpt_ds.json for people and tools
_.find_class  # pickle.Unpickler's hook, called by pickle (data/tokens.py)
_.readable  # io.RawIOBase's method, called by io.BufferedReader (data/prepare/inputs.py)
_.n_ctx  # a GPT2Config attribute read by inference stacks from config.json (export/hf.py)
_.architectures  # a config.json field read by transformers' Auto classes (export/hf.py)
allgather_bucket_size  # a ZeroSettings field, filled from the config by name (memory/estimate)
settings_from  # a Candidate field, printed by tools/pick_preset.py --json through asdict
_._attn_implementation  # read by transformers' attention dispatch (model/gpt2.py)
_.is_custom_code  # transformers' PreTrainedModel hook (model/training_model.py)
_.__class__  # the training model's class swap, read by Python itself
_.mask_nan_or_inf_with_val_inplace  # DeepSpeed's function, replaced (training/engine_build.py)
_.is_invalid_grad_norm  # DeepSpeed's function, replaced (training/engine_build.py)
_.use_muon  # read by DeepSpeed's Muon: the engine's _muon_param_groups (model/gpt2.py)
