#!/usr/bin/env bash
# Run a command in the gpt_ds container on this node, set up for (multi-node) training:
# host network (NCCL/RCCL and the master port use the host's interfaces directly), the GPUs,
# shared memory, the data and checkpoint directories at the SAME path as on the host (so the
# same path on every node), and the launch environment passed through.
#
#   GPT_DS_DATA_DIR=/shared/data GPT_DS_CKPT_DIR=/shared/out launchers/docker/run.sh \
#       launchers/run_node.sh 0 10.0.0.1 2 -- --deepspeed_config ds_configs/zero2.json \
#       --data_dir /shared/data/owt --out_dir /shared/out/run1
#
# (The same on every node with its NODE_RANK; the command runs in /workspace/gpt_ds.)
# Knobs (the older names without GPT_DS_ still work, said): GPT_DS_PLATFORM (cuda | rocm;
# default rocm when /dev/kfd exists), GPT_DS_IMAGE (default gpt_ds:PLATFORM), GPT_DS_DATA_DIR /
# GPT_DS_CKPT_DIR (host directories, colon-separated lists allowed), GPT_DS_MOUNT_CODE=1 (this
# checkout over /workspace/gpt_ds), GPT_DS_SSH_DIR (mounted as /root/.ssh, for hostfile
# launches between containers: their sshd listens on 2222, so GPT_DS_SSH_PORT=2222),
# GPT_DS_IPC_HOST=0 with GPT_DS_SHM_SIZE (default 16g) instead of --ipc=host, GPT_DS_DOCKER_ARGS
# (more options), GPT_DS_EXT_VOLUME (the JIT cache of DeepSpeed ops, mounted at the image's
# TORCH_EXTENSIONS_DIR; default: a Docker volume named after the image's id, so it outlives
# `--rm` containers and a rebuilt image, whose torch may differ, gets a fresh one; a host
# directory works too). The launch knobs (GPT_DS_NET_IF, ..., NCCL_*) are passed in.
# Stop with `docker stop -t 120 NAME`: the ranks get SIGTERM and time to save a checkpoint.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=launchers/settings.sh
. "$root/launchers/settings.sh"
[ $# -gt 0 ] || set -- bash

platform=$(gpt_ds_setting PLATFORM "$([ -e /dev/kfd ] && echo rocm || echo cuda)")
image=$(gpt_ds_setting IMAGE "gpt_ds:$platform")
args=(--rm --init --network host --ulimit memlock=-1 --ulimit stack=67108864
    -w /workspace/gpt_ds)
[ ! -t 0 ] || args+=(-it)
if [ "$(gpt_ds_setting IPC_HOST 1)" = 1 ]; then
    args+=(--ipc host)
else
    args+=(--shm-size "$(gpt_ds_setting SHM_SIZE 16g)")
fi
case $platform in
    cuda) args+=(--gpus all) ;;
    rocm)
        args+=(--device /dev/kfd --device /dev/dri --group-add video
            --security-opt seccomp=unconfined --cap-add SYS_PTRACE)
        render_gid=$(getent group render | cut -d: -f3 || true)
        [ -z "$render_gid" ] || args+=(--group-add "$render_gid")
        ;;
    *)
        echo "error: GPT_DS_PLATFORM must be cuda or rocm, got '$platform'" >&2
        exit 2
        ;;
esac

IFS=: read -r -a dirs <<<"$(gpt_ds_setting DATA_DIR ""):$(gpt_ds_setting CKPT_DIR "")"
for d in "${dirs[@]}"; do
    [ -n "$d" ] || continue
    mkdir -p "$d"
    d=$(cd "$d" && pwd)
    args+=(-v "$d:$d")
done
[ "$(gpt_ds_setting MOUNT_CODE 0)" != 1 ] || args+=(-v "$root:/workspace/gpt_ds")
ssh_dir=$(gpt_ds_setting SSH_DIR "")
[ -z "$ssh_dir" ] || args+=(-v "$ssh_dir:/root/.ssh:ro")
# ops the image did not prebuild are JIT-compiled on first use (minutes): keep them outside
image_id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
image_id=${image_id#sha256:}
key=${image_id:0:12}
[ -n "$key" ] || key=${image//[^A-Za-z0-9_.-]/_} # not pulled yet: by name
args+=(-v "$(gpt_ds_setting EXT_VOLUME "gpt_ds_torch_extensions_$key"):/opt/torch_extensions")

# the launch environment (not TORCH_EXTENSIONS_DIR: the image's points at the volume above).
# The launchers' knobs by either name: the container's launcher says an older one.
knobs='NET_IF|USE_IB|SKIP_PREFLIGHT|HOSTFILE|GPUS_PER_NODE|NUM_GPUS|MIN_FREE_GB|DS_ENV_EXTRA|SSH_PORT'
while IFS= read -r name; do
    args+=(-e "$name")
done < <(compgen -e | grep -E "^((GPT_DS_)?($knobs)\$|NCCL_|GLOO_|HSA_|HIP_|RCCL_|MIOPEN_|TORCH_NCCL_|TORCH_FR_|TORCH_DISTRIBUTED_|PYTORCH_|HF_|WANDB_|DEEPSPEED_TIMEOUT\$|CUDA_VISIBLE_DEVICES\$|OMP_NUM_THREADS\$|MASTER_ADDR\$|MASTER_PORT\$)" || true)

read -r -a extra <<<"$(gpt_ds_setting DOCKER_ARGS "")"
exec docker run "${args[@]}" "${extra[@]}" "$image" "$@"
