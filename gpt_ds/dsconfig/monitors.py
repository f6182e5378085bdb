"""The DeepSpeed config's monitor sections (TensorBoard, Weights & Biases, CSV).

`--tensorboard_dir`, `--wandb_project` and `--csv_dir` fill the DeepSpeed config's
`tensorboard` / `wandb` / `csv_monitor` sections (a user's config may hold them instead);
`check_monitors` refuses, before any model is built, a W&B run that would fail at its first
log, and `monitor_package_problems` an enabled section whose package the machine lacks (the
resolution reports it with every other problem). The trainer then writes through them
(observe/metrics.py).
"""

from __future__ import annotations

import copy
from collections.abc import Container, Mapping
from pathlib import Path

from packaging.version import Version

from gpt_ds.base.errors import ConfigError

SECTIONS = ("tensorboard", "wandb", "csv_monitor")

# Monitor sections whose package DeepSpeed imports only inside deepspeed.initialize, and the
# oldest version it accepts (compared as DeepSpeed's monitor/utils.py does: PEP 440, where a
# release candidate comes before its release).
MONITOR_PACKAGES = {
    "tensorboard": ("tensorboard", None),
    "wandb": ("wandb", None),
    "comet": ("comet_ml", "3.41.0"),
}


def with_monitor_flags(
    raw: dict,
    out_dir: str,
    tensorboard_dir: str | None,
    csv_dir: str | None,
    wandb_project: str | None,
    run_name: str,
) -> dict:
    """The DeepSpeed config with the monitor flags filled in.

    A section the user's config enables without an output path writes under OUT_DIR instead of
    DeepSpeed's default (~/tensorboard, ~/csv_monitor); each run writes in a folder named
    after it (job_name), so several runs share one `tensorboard --logdir`."""
    ds_config = copy.deepcopy(raw)
    for section, path in (("tensorboard", tensorboard_dir), ("csv_monitor", csv_dir)):
        sec = ds_config.setdefault(section, {}) if path else ds_config.get(section, {})
        if path:
            sec.update(enabled=True, output_path=str(path))
        if sec.get("enabled"):  # DeepSpeed's defaults: "" (its ~/<section> folder), a fixed name
            sec["output_path"] = sec.get("output_path") or str(Path(out_dir) / section)
            if sec.get("job_name") in (None, "", "DeepSpeedJobName"):
                sec["job_name"] = run_name
    if wandb_project:
        ds_config.setdefault("wandb", {}).update(enabled=True, project=wandb_project)
    return ds_config


def enabled(ds_config: dict, section: str) -> bool:
    """Whether the DeepSpeed config turns this monitor section on."""
    return bool(ds_config.get(section, {}).get("enabled"))


def describe(ds_config: dict, mode: str) -> list[str]:
    """One log line per enabled monitor: where its events go (W&B's in its `mode`)."""
    lines = []
    for section in SECTIONS:
        sec = ds_config.get(section, {})
        if not sec.get("enabled"):
            continue
        if section == "wandb":
            project = sec.get("project", "deepspeed")
            lines.append(f"monitor: W&B project {project} ({mode} mode)")
        else:
            where = Path(sec.get("output_path", "")) / sec.get("job_name", "")
            lines.append(f"monitor: {section} -> {where}")
    return lines


def wandb_mode(environ: Mapping[str, str]) -> str:
    """online, offline or disabled, as W&B itself reads it (WANDB_MODE) from `environ`."""
    mode = environ.get("WANDB_MODE", "online").lower()
    return "offline" if mode == "dryrun" else mode


def check_monitors(ds_config: dict, mode: str, has_key: bool) -> None:
    """Refuse a W&B run that would fail at its first log: online (`mode`) without an API key
    (`has_key`: the machine's, probed once). (A monitor's missing package is resolve.py's to
    report, with DeepSpeed's other checks.)"""
    if enabled(ds_config, "wandb") and mode == "online" and not has_key:
        raise ConfigError(
            [
                "wandb: online mode needs an API key: run `wandb login`, set WANDB_API_KEY, "
                "or log offline with WANDB_MODE=offline (then `wandb sync` the run directory)"
            ],
            source="monitors",
        )


def wandb_env(
    ds_config: dict, out_dir: str, run_name: str, environ: Container[str]
) -> dict[str, str]:
    """W&B's run name and local directory, which it reads from the environment when DeepSpeed
    calls wandb.init (its config has neither): the run's name, files under OUT_DIR/wandb; a
    user's own settings (the names set in `environ`) kept. Empty without W&B."""
    if not enabled(ds_config, "wandb"):
        return {}
    wanted = {"WANDB_NAME": run_name, "WANDB_DIR": str(Path(out_dir))}
    return {k: v for k, v in wanted.items() if k not in environ}


def monitor_package_problems(ds_config: dict, installed: Mapping[str, str | None]) -> list[str]:
    """An enabled monitor section whose package is not `installed` (the machine's versions,
    probed once), or older than DeepSpeed needs: each a problem with its fix."""
    problems = []
    for section, (package, min_version) in MONITOR_PACKAGES.items():
        if not ds_config.get(section, {}).get("enabled"):
            continue
        version = installed.get(package)
        if version is None:
            flag = {"tensorboard": "--tensorboard_dir", "wandb": "--wandb_project"}.get(section)
            how = "pip install 'gpt_ds[monitor]'" if flag else f"pip install {package}"
            drop = f"drop {flag} or set" if flag else "set"
            problems.append(
                f"{section}.enabled is true but the '{package}' package is not installed: "
                f"{how}, or {drop} {section}.enabled to false"
            )
        elif min_version and Version(version) < Version(min_version):
            problems.append(
                f"{section}.enabled is true but DeepSpeed needs {package}>={min_version}: "
                f'pip install "{package}>={min_version}", or set {section}.enabled to false'
            )
    return problems
