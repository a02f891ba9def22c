"""Three GRPO trainer steps on fixed rollout files, for `test_fsdp.py`: run it plainly (one process) or
under `torchrun --nproc_per_node N` (FSDP2 over gloo on CPU); either way it writes the final weights
and each step's figures under OUT, so the test can compare the two.

    python tests/integration/fsdp_steps.py MODEL_DIR OUT
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pool.grpo import Trainer
from tests.grpo_data import rollout


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    if "RANK" in os.environ:
        torch.distributed.init_process_group("gloo")
    t = Trainer(model_dir, lr=1e-2, async_level=1, micro_batch_size=2)
    assert t.distributed == ("RANK" in os.environ and int(os.environ["WORLD_SIZE"]) > 1)
    f0 = rollout(0, [[1.0, 0.0, 0.3, 0.9], [0.1, 0.2, 0.7], [0.5, 0.5, 0.0, 1.0, 0.2]], seed=3)
    f1 = rollout(1, [[0.0, 1.0, 0.4], [0.9, 0.1, 0.3, 0.6]], seed=4)
    f2 = rollout(2, [[0.2, 0.8, 0.5, 0.1, 0.0]], seed=5)
    late0 = rollout(0, [[0.3, 0.6, 1.0], [0.0, 0.4, 0.2, 0.8]], seed=6)  # one version old at step 1
    stats = [t.step([f0], 0), t.step([f1, late0], 1), t.step([f2, late0], 2)]  # late0 stale at step 2
    t.save(out / "ckpt")
    if t.rank == 0:
        figures = [asdict(s) | {"seconds": 0.0} for s in stats]
        (out / "stats.json").write_text(json.dumps({"world": t.world, "steps": figures}))
    if t.distributed:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
