# shellcheck shell=bash
# The launchers' knobs have names of their own, GPT_DS_<NAME> (GPT_DS_HOSTFILE, GPT_DS_NET_IF,
# ...): generic names such as OUT, HOSTFILE or IMAGE are often set by shells, schedulers and
# other tools for something else. Sourced by launchers/env.sh, and by the scripts that do not
# source env.sh (setup_env.sh, wheelhouse.sh, slurm.sbatch, docker/run.sh).
#
# gpt_ds_setting NAME DEFAULT: prints GPT_DS_NAME's value; else NAME's, the older name, which
# still works and is said on stderr; else DEFAULT. An empty value counts as unset. Call it once
# per knob (each call with the older name says so).
gpt_ds_setting() {
    local new=GPT_DS_$1 old=$1
    if [ -n "${!new:-}" ]; then
        printf '%s\n' "${!new}"
    elif [ -n "${!old:-}" ]; then
        echo "note: using $old=${!old} as $new (the older name; set $new instead)" >&2
        printf '%s\n' "${!old}"
    else
        printf '%s\n' "${2:-}"
    fi
}
