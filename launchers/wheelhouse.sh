#!/usr/bin/env bash
# A wheelhouse for nodes without internet: every wheel gpt_ds needs beyond torch, for a target
# Python and platform, plus gpt_ds itself. Run it where PyPI is reachable, copy DIR over, then
# on each node (its torch already installed, the build of its GPUs):
#
#   pip install --no-index --find-links DIR gpt_ds            # or 'gpt_ds[dev,bench]'
#
#   bash launchers/wheelhouse.sh DIR [--extras dev,bench] [--python 3.12] [--platform TAG]...
#                                    [--have FREEZE.txt]
#
# --python / --platform: the target's (default: this machine's); --platform repeats (e.g.
# manylinux_2_28_x86_64); --have: the target's `pip freeze`, whose projects are left out where
# their version meets gpt_ds's requirement (an older one goes in, named on stderr).
# DeepSpeed is on PyPI as an sdist only: it is built here into a pure wheel with no ops
# prebuilt (the trainer then picks torch's fused AdamW where no CUDA compiler is at hand).
# GPT_DS_PYTHON: the interpreter with torch (default .venv's; PYTHON, the older name, is said).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launchers/settings.sh
. "$ROOT/launchers/settings.sh"
python=$(gpt_ds_setting PYTHON "$ROOT/.venv/bin/python")
[ -x "$python" ] || python=$(command -v python3)

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then usage; fi
DIR=$1; shift
EXTRAS="" TARGET_PY="" HAVE="" PLATFORMS=()
while [ $# -gt 0 ]; do
    case $1 in
        --extras) EXTRAS=${2:?--extras needs a value, e.g. dev,bench}; shift 2 ;;
        --python) TARGET_PY=${2:?--python needs a version, e.g. 3.12}; shift 2 ;;
        --platform) PLATFORMS+=("${2:?--platform needs a tag}"); shift 2 ;;
        --have)
            HAVE=${2:?--have needs a pip freeze file}
            [ -f "$HAVE" ] || { echo "error: --have $HAVE: no such file" >&2; exit 2; }
            shift 2 ;;
        *) echo "error: unknown option $1" >&2; usage ;;
    esac
done
if ! "$python" -c "import torch" 2>/dev/null; then
    echo "error: $python has no torch; DeepSpeed's wheel is built against it: run" \
        "launchers/setup_env.sh first, or set GPT_DS_PYTHON" >&2
    exit 2
fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The target's tags, for resolving and downloading binary wheels only.
TARGET=(--only-binary=:all:)
if [ -n "$TARGET_PY" ] || [ ${#PLATFORMS[@]} -gt 0 ]; then
    TARGET+=(--python-version "${TARGET_PY:-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}")
    for tag in "${PLATFORMS[@]}"; do TARGET+=(--platform "$tag"); done
fi

echo "wheelhouse: building gpt_ds and DeepSpeed (pure wheels) into $DIR" >&2
"$python" -m pip wheel --quiet --no-deps -w "$DIR" "$ROOT"
read -r VERSION DS_SPEC < <("$python" - "$ROOT/pyproject.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
print(re.search(r'^version = "([^"]+)"', text, re.M)[1],
      re.search(r'^\s*"(deepspeed[^"]*)",', text, re.M)[1])
PY
)
"$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DIR" "$DS_SPEC"

echo "wheelhouse: resolving gpt_ds${EXTRAS:+[$EXTRAS]} for the target" >&2
WHEEL=$DIR/gpt_ds-$VERSION-py3-none-any.whl
RESOLVE=(--dry-run --ignore-installed --quiet --report "$WORK/report.json" --find-links "$DIR")
[ ${#TARGET[@]} -gt 1 ] && RESOLVE+=(--target "$WORK/target")
"$python" -m pip install "${RESOLVE[@]}" "${TARGET[@]}" "$WHEEL${EXTRAS:+[$EXTRAS]}"
PICK=("$WORK/report.json" --extras "$EXTRAS")
[ -n "$TARGET_PY" ] && PICK+=(--python "$TARGET_PY")
[ -n "$HAVE" ] && PICK+=(--have "$HAVE")
"$python" "$ROOT/gpt_ds/launch/wheelhouse.py" "${PICK[@]}" |
    { grep -viE '^(gpt[-_]ds|deepspeed)==' || true; } > "$WORK/needed.txt"  # built above

echo "wheelhouse: downloading $(wc -l < "$WORK/needed.txt") wheels" >&2
if [ -s "$WORK/needed.txt" ]; then
    "$python" -m pip download --quiet --no-deps "${TARGET[@]}" -d "$DIR" -r "$WORK/needed.txt"
fi
SIZE=$(du -sm "$DIR" | cut -f1)
echo "wheelhouse: $DIR holds $(find "$DIR" -name '*.whl' | wc -l) wheels, ${SIZE} MiB." \
    "On the node: pip install --no-index --find-links $DIR 'gpt_ds${EXTRAS:+[$EXTRAS]}'" >&2
