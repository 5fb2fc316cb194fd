#!/usr/bin/env bash
# The GPU check (docs/performance.md, "GPU check"): on the device machine, from the repository root,
#
#     bash scripts/gpu_check.sh [bench/gpu_check.py flags, e.g. --cases torch-engine,hf-engine]
#
# with the wheels of `make gpu-wheels` carried in .gpu-wheels/. That machine has Python 3.12, torch with CUDA and
# transformers, but not pydantic (aligner.config) nor megatron-core (model.backend megatron), and cannot download:
# those install here from the carried wheels (no index, no dependencies: the machine's own torch, numpy and packaging
# stay). The project goes on PYTHONPATH rather than `pip install -e .`: installing it would register the service's
# `aligner` subcommands, whose imports (flask, celery, ...) that machine lacks. The check takes at most 8 minutes:
# about half a minute here, then bench/gpu_check.py within its --budget (420 s) and a hard limit (450 s). Its JSON
# goes to $OUT/gpu_check.json, each case's log beside it.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
SITE=${GPU_SITE:-/tmp/aligner-site}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || { echo "gpu_check: installing the wheels of $WHEELS failed" >&2; exit 1; }
else
    echo "gpu_check: no wheels in $WHEELS (make gpu-wheels, then carry it): using what is installed" >&2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PYTHON" - <<'EOF' || { echo "gpu_check: aligner does not import" >&2; exit 1; }
import importlib.metadata as md
import platform

import torch

import aligner.config  # noqa: F401  (pydantic)

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "missing"

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, GPU {gpu}")
print(", ".join(f"{n} {version(n)}" for n in ("transformers", "pydantic", "pydantic-core", "megatron-core")))
EOF

timeout -k 10 450 "$PYTHON" bench/gpu_check.py --budget 420 "$@"
status=$?
[ "$status" = 124 ] && echo "gpu_check: stopped at its 450 s limit; the JSON holds the cases done" >&2
exit "$status"
