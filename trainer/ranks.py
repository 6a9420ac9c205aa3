"""The training job's processes: one, or several under `accelerate launch`
(training.compute.processes), each generating its share of a step's groups against its own
environments. Rank 0 owns what the run writes: it opens the journal, records every rank's
attempts in the ledger (gathered at each step's end, in rank order), decides checkpoints and the
budget's stop for all, saves the checkpoints and writes run.json; the other ranks follow its
decisions. With one process every call here is the identity, so a one-process run is what it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Ranks:
    index: int = field(default_factory=lambda: int(os.environ.get("RANK", "0")))
    count: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", "1")))

    @property
    def main(self) -> bool:
        return self.index == 0

    @property
    def several(self) -> bool:
        return self.count > 1

    def start(self) -> None:
        """Join the process group (accelerate's state, which the trainer then uses) before the
        first collective step; nothing for one process."""
        if self.several:
            from accelerate import PartialState

            PartialState()

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.several:
            return [obj]
        import torch.distributed as dist

        gathered = [None] * self.count
        dist.all_gather_object(gathered, obj)
        return gathered

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.several:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.several:
            import torch.distributed as dist

            dist.barrier()
