"""`aligner train` with model.backend=megatron on the CPU: the test shim, then the real CLI (one rank of torchrun).

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 tests/helpers/megatron_train.py \
        train --config run.yaml [--resume]

Production needs none of this (CUDA + NCCL): `torchrun ... -m aligner.cli train --config run.yaml`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import megatron_shim  # noqa: E402

megatron_shim.install()

from aligner.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
