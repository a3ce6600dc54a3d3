"""The variant table (#68 item 2): what each training variant is, declared once. The worker
(harness/train/worker.py), the many-rank mode (harness/scale/training.py), the scoring
(harness/eval/models.py) and the bench's references (harness/bench/spec.py) read it instead
of asking `variant ==` one by one.

    variant         wrapped by                         estimator      optimizer  scored by
    reliable        DDP's own all-reduce, timed        -              the run's  rank 0's model
    zero_fill       the lossy all-reduce as DDP hook   zero_fill      the run's  the ranks' own
    unbiased        the lossy all-reduce as DDP hook   received_mean  the run's  the ranks' own
    unbiased_drift  the owners' sharded optimizer      received_mean  the run's  the owners'
    rps             RPS's optimizer                    -              SGD        the ranks' own

Every variant is compared with reliable under the same optimizer (the lossless run of the
model the claim is about); a variant whose `self_reference_off_own_optimizer` is set
(rps: another algorithm than reliable) is compared with itself without loss under any other
optimizer, so that its Δppl is the loss's effect alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.names import VARIANTS

Wrapper = Literal["reliable", "gradient_hook", "sharded_optimizer", "rps_optimizer"]
Headline = Literal["rank0", "rank_mean", "owners"]


@dataclass(frozen=True)
class VariantKind:
    name: str
    wrapper: Wrapper
    """How the model and its optimizer are wrapped (harness/api.py: reliable, lossy_gradients,
    bounded_drift, rps)."""
    estimator: str | None
    """The lossy all-reduce's estimator of a missing contribution (rebuild.py); None: none."""
    own_optimizer: str
    """The optimizer its text leaves unsaid (`rps` is RPS under SGD, `rps/adamw` under
    AdamW; `unbiased` is AdamW's)."""
    optimizer_fixed: bool
    """The bench's --optimizer leaves it at its own (rps: SGD, as 1810.07766 runs it); the
    others take the bench's."""
    headline: Headline
    """Which model is scored as the variant's (harness/eval/models.py): rank 0's (every rank
    holds the same), the ranks' own (their mean; replicas that never re-synchronise are what
    a user has), or the owners' (each shard as its owner holds it)."""
    self_reference_off_own_optimizer: bool = False
    """Under another optimizer than its own, compared with itself without loss."""

    @property
    def replicas_differ(self) -> bool:
        """Its ranks' models can differ (every variant but reliable): their drift is
        measured."""
        return self.headline != "rank0"

    @property
    def bounded_by_owners(self) -> bool:
        """Its replicas are bounded by the owners' model (drift is measured against it);
        the others' by the ranks' mean."""
        return self.headline == "owners"


TABLE: dict[str, VariantKind] = {v.name: v for v in (
    VariantKind("reliable", "reliable", None, "adamw", False, "rank0"),
    VariantKind("zero_fill", "gradient_hook", "zero_fill", "adamw", False, "rank_mean"),
    VariantKind("unbiased", "gradient_hook", "received_mean", "adamw", False, "rank_mean"),
    VariantKind("unbiased_drift", "sharded_optimizer", "received_mean", "adamw", False,
                "owners"),
    VariantKind("rps", "rps_optimizer", None, "sgd", True, "rank_mean",
                self_reference_off_own_optimizer=True),
)}
assert tuple(TABLE) == VARIANTS, "every variant of harness/names.py has one entry here"


def of(name: str) -> VariantKind:
    """The variant called `name` (a base name: no /optimizer or @transport)."""
    try:
        return TABLE[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(TABLE)}") from None


def estimators() -> dict[str, str]:
    """variant -> the estimator its lossy all-reduce uses (those that have one)."""
    return {v.name: v.estimator for v in TABLE.values() if v.estimator}
