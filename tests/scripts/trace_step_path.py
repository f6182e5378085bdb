"""Which gpt_ds files run between `gpt_ds.train.main()` and DeepSpeed's first optimizer step.

Run as `python tests/scripts/trace_step_path.py OUT.json -- TRAIN_ARGS...` (one process, no
launcher). A profile hook, in the main thread and every thread the run starts, records the
file of every gpt_ds function called (module bodies run at import are not calls and are not
counted); on the first call of DeepSpeed's
`DeepSpeedEngine.step` it writes the sorted repo-relative paths to OUT.json and exits 0, so
nothing after the step is traced. Also written: the gpt_ds modules imported by then.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = str(REPO / "gpt_ds") + os.sep


def main(out: Path, train_args: list[str]) -> None:
    seen: set[str] = set()

    def profile(frame, event, _arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        path = code.co_filename
        if path.startswith(PACKAGE) and code.co_name != "<module>":
            seen.add(path)
        elif code.co_name == "step" and path.endswith(
            os.path.join("deepspeed", "runtime", "engine.py")
        ):
            sys.setprofile(None)
            threading.setprofile(None)
            files = sorted(str(Path(p).relative_to(REPO)) for p in seen)
            modules = sorted(m for m in sys.modules if m.split(".")[0] == "gpt_ds")
            out.write_text(json.dumps({"files": files, "modules": modules}, indent=1))
            sys.stdout.flush()
            os._exit(0)

    from gpt_ds.train import main as train_main

    threading.setprofile(profile)  # threads the run starts (watchdog, launch watch) count too
    sys.setprofile(profile)
    train_main(train_args)
    sys.setprofile(None)
    raise SystemExit("the run ended without an optimizer step")


if __name__ == "__main__":
    split = sys.argv.index("--")
    main(Path(sys.argv[1]), sys.argv[split + 1 :])
