"""Counts from several ranks, summed."""

from __future__ import annotations


def summed(counts) -> dict:
    """Per key, the sum over these dicts of counts; a key counted 0 stays (Counter's sum
    would drop it, and 0 deadlines hit is a result)."""
    total: dict = {}
    for one in counts:
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
    return total
