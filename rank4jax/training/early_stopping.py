"""Early stopping on the selection loss: stop after ``patience`` validations without improvement.

The state is two numbers (the best validation loss so far and the validations since it), and it is
rebuilt on resume from the checkpoints alone: with early stopping on, every validated step is
checkpointed with its loss, and the preservation policy always keeps the best one, so the best loss
is that checkpoint's metric and the validations since it are the ``eval_every`` boundaries between
it and the restored step. A resumed run therefore stops at the same step as an uninterrupted one,
and rerunning a run that stopped early trains nothing.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class EarlyStopping:
    patience: int  # 0 = off
    best: float = math.inf
    best_step: int | None = None
    since: int = 0  # validations since the best one

    @property
    def stopped(self) -> bool:
        return self.patience > 0 and self.since >= self.patience

    def update(self, step: int, loss: float) -> bool:
        """Record a validation loss; True when the run should stop here."""
        if loss < self.best:
            self.best, self.best_step, self.since = loss, step, 0
        else:
            self.since += 1
        return self.stopped

    @classmethod
    def resume(cls, patience: int, best: tuple[int, float] | None, start: int, eval_every: int) -> EarlyStopping:
        """The state at step ``start``, given the best checkpoint's (step, loss) or None."""
        if best is None:  # nothing validated yet (every validated step is checkpointed)
            return cls(patience)
        step, loss = best
        return cls(patience, loss, step, start // eval_every - step // eval_every)
