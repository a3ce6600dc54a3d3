"""The fixed sets of names lossbed takes, each declared once as a Literal type (for the
signatures and records) and its tuple (for the choices and the checks).

A variant names what travels and how (harness/collectives/); a lossy stage which stage of a
lossy variant crosses the lossy transport; the optimizer, schedule, device and regime are a
run's settings (harness/train/config.py, harness/bench/spec.py).
"""

from __future__ import annotations

from typing import Literal, get_args

Variant = Literal["reliable", "zero_fill", "unbiased", "unbiased_drift", "rps"]
LossyStage = Literal["both", "reduce", "broadcast"]
Optimizer = Literal["adamw", "sgd"]
Schedule = Literal["cosine", "constant"]
Device = Literal["cpu", "cuda"]
Regime = Literal["scratch", "finetune"]

VARIANTS: tuple[str, ...] = get_args(Variant)
LOSSY_STAGES: tuple[str, ...] = get_args(LossyStage)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
DEVICES: tuple[str, ...] = get_args(Device)
REGIMES: tuple[str, ...] = get_args(Regime)
