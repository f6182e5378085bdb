"""Convert a gpt_ds ZeRO checkpoint (stage 1, 2 or 3, any world size and precision) for inference.

    gpt-ds-export out/ --output export/            # the tag `latest` names -> HF
    gpt-ds-export out/ --tag iter_200 --output export/ --dtype bf16
    gpt-ds-export out/ --tag best --output export/     # the checkpoint of the best val loss
    gpt-ds-export out/ --output sd/ --format safetensors
    gpt-ds-export out/ --output model.gguf --format gguf --dtype q8_0   # llama.cpp

(`python tools/zero_to_fp32.py ...` in a checkout is the same command.)

--format hf (default) writes a Hugging Face GPT-2 directory (config.json, model.safetensors,
generation_config.json, tokenizer) that AutoModelForCausalLM / AutoTokenizer load offline;
safetensors (tied lm_head left out, as Hugging Face does) and pt (every name) write a bare
state dict next to config.json. Weights are located by DeepSpeed's own zero_to_fp32 code
(all stages, offload or not, any world size and precision) and streamed from the memory-mapped
checkpoint files into the output, with no copy of the model in memory; see gpt_ds/export/hf.py.
--format gguf writes one .gguf file for llama.cpp (pip install 'gpt_ds[gguf]'; --dtype fp32,
fp16, bf16 or q8_0); see gpt_ds/export/gguf.py.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.cli import option, parse, run_tool
from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.integrity import ALLOW_HELP
from gpt_ds.export.gguf import export_gguf
from gpt_ds.export.hf import DTYPES, FORMATS, export_checkpoint, export_summary


@dataclass
class ExportOptions:
    checkpoint: Path = option(
        help="training --out_dir (or one tag directory in it)", positional=True
    )
    output: Path = option(help="directory to create")
    tag: str | None = option(
        None, "checkpoint tag, or 'best': the best by val loss (default: the one `latest` names)"
    )
    format: str = option("hf", "what to write", choices=(*FORMATS, "gguf"))
    dtype: str = option(
        "fp32", "weights' dtype (q8_0: --format gguf only)", choices=(*DTYPES, "q8_0")
    )
    name: str | None = option(
        None, "--format gguf: the model's name in the file (default: the run directory's)"
    )
    max_shard_size: str = option(
        "2GB", "split weights into files of at most this size, with an index json"
    )
    overwrite: bool = option(False, "replace an existing --output")
    quiet: bool = option(False, "no progress bar")
    allow_unverified: bool = option(False, ALLOW_HELP)


def main(argv: list[str] | None = None) -> int:
    opts = parse(ExportOptions, argv, description=__doc__)

    def export() -> int:
        if opts.format == "gguf":
            print(export_gguf(opts.checkpoint, opts.output, tag=opts.tag, dtype=opts.dtype,
                              name=opts.name, overwrite=opts.overwrite,
                              progress=not opts.quiet,
                              allow_unverified=opts.allow_unverified))  # fmt: skip
            return 0
        if opts.dtype not in DTYPES:
            raise CheckpointError(f"--dtype {opts.dtype} is for --format gguf only")
        result = export_checkpoint(
            opts.checkpoint,
            opts.output,
            tag=opts.tag,
            fmt=opts.format,
            dtype=opts.dtype,
            max_shard_size=opts.max_shard_size,
            overwrite=opts.overwrite,
            progress=not opts.quiet,
            allow_unverified=opts.allow_unverified,
        )
        print(export_summary(result))
        # exit without collecting torch's and transformers' objects one by one (0.6 s)
        gc.freeze()
        return 0

    return run_tool(export, interrupted="interrupted: nothing was written")


if __name__ == "__main__":
    sys.exit(main())
