"""Convert a gpt_ds ZeRO checkpoint (stage 1, 2 or 3, any world size and precision) for inference.

    python tools/zero_to_fp32.py out/ --output export/            # the tag `latest` names -> HF
    python tools/zero_to_fp32.py out/ --tag iter_200 --output export/ --dtype bf16
    python tools/zero_to_fp32.py out/ --output sd/ --format safetensors

--format hf (default) writes a Hugging Face GPT-2 directory (config.json, model.safetensors,
generation_config.json, tokenizer) that AutoModelForCausalLM / AutoTokenizer load offline;
safetensors (tied lm_head left out, as Hugging Face does) and pt (every name) write a bare
state dict next to config.json. Weights are gathered by DeepSpeed's own zero_to_fp32 code
(all stages, offload or not, any world size and precision); see gpt_ds/export.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt_ds.errors import GptDsError
from gpt_ds.export import DTYPES, FORMATS, export_checkpoint, export_summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="training --out_dir (or one tag directory in it)")
    p.add_argument("--tag", default=None, help="checkpoint tag (default: the one `latest` names)")
    p.add_argument("--output", type=Path, required=True, help="directory to create")
    p.add_argument("--format", choices=FORMATS, default="hf", help="default: hf")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="default: fp32")
    p.add_argument(
        "--max_shard_size",
        default="2GB",
        help="split weights into files of at most this size, with an index json (default 2GB)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = export_checkpoint(
            args.checkpoint,
            args.output,
            tag=args.tag,
            fmt=args.format,
            dtype=args.dtype,
            max_shard_size=args.max_shard_size,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
    except GptDsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
    print(export_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
