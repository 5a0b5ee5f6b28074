"""Where an iterator stands in its data: the state that checkpoints save.

[Note: resuming]
A position is ``(epoch, examples)``: the epoch, and how many examples of it (over all ranks) the
batches handed out so far hold. A batch counts as consumed when it is yielded, so a checkpoint
written after training on batch ``k`` resumes at batch ``k + 1``. The epoch advances when an
iteration runs out (the ``next()`` after the last batch); an iterator stopped right after the
last batch of an epoch resumes with an empty rest of that epoch, and the following ``iter()``
starts the next one: exactly what a loop ``for epoch ...: for batch in it`` that resumes at the
saved epoch expects.

A position saved with global batch size ``G`` can be loaded with another ``G'`` (another world
size) when it falls on a boundary of both; a position that is not a multiple of ``G`` is the end
of an epoch (a partial last batch), which ends the epoch for any ``G'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Position"]


@dataclass
class Position:
    epoch: int = 0
    examples: int = 0

    def next_epoch(self) -> None:
        self.epoch += 1
        self.examples = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "examples": self.examples}

    def load_state_dict(
        self,
        owner: str,
        state: dict[str, Any],
        *,
        expected: dict[str, Any],
        global_batch_size: int,
        num_examples: int | None = None,
    ) -> None:
        """Check ``state`` against this iterator (``expected`` values, the batch boundary; see
        [Note: resuming]; ``num_examples`` when known), then take its epoch and examples."""
        needed = ["epoch", "examples", "global_batch_size", *expected]
        missing = [key for key in needed if key not in state]
        if missing:
            raise ValueError(
                f"{owner}.load_state_dict: the state lacks {missing}; pass what "
                f"{owner}.state_dict() returned"
            )
        for key, value in expected.items():
            if state[key] != value:
                raise ValueError(
                    f"{owner}.load_state_dict: the state was saved with {key}={state[key]!r} "
                    f"but this iterator has {key}={value!r}; build the iterator as it was "
                    "built when the state was saved"
                )
        epoch, examples, saved_size = state["epoch"], state["examples"], state["global_batch_size"]
        if epoch < 0 or examples < 0:
            raise ValueError(
                f"{owner}.load_state_dict: epoch and examples must be >= 0, got {epoch}, {examples}"
            )
        if num_examples is not None and examples > num_examples:
            raise ValueError(
                f"{owner}.load_state_dict: the state is at example {examples} of a data set of "
                f"{num_examples}; pass what {owner}.state_dict() returned"
            )
        if examples % saved_size == 0 and examples % global_batch_size:
            raise ValueError(
                f"{owner}.load_state_dict: the state stopped after {examples} examples, not a "
                f"multiple of this iterator's global batch size {global_batch_size} "
                "(batch_size * world_size); resume with a global batch size that divides it, "
                f"e.g. the saved one ({saved_size})"
            )
        self.epoch, self.examples = epoch, examples
