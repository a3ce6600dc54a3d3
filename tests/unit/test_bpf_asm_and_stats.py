"""The eBPF assembler against hand-checked encodings, the program's generator against its
Python twin, u32 port prefixes, and the statistics used by verify."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed import stats
from testbed.impair import bpf_asm, bpf_program, u32_match
from testbed.impair.bpf_asm import R0, R1, R6, R10, Asm
from testbed.profiles.model import Match


def test_instruction_encodings_match_the_uapi():
    a = Asm()
    a.mov(R0, -1)                    # BPF_ALU64|BPF_MOV|BPF_K = 0xb7
    a.mov(R6, R1, reg=True)          # 0xbf, src in the high nibble
    a.load(4, R1, R6, 76)            # BPF_LDX|BPF_W|BPF_MEM = 0x61
    a.atomic_add64(R6, 64, R1)       # BPF_STX|BPF_DW|BPF_ATOMIC = 0xdb, imm BPF_ADD = 0
    a.to_be16(R1)                    # BPF_ALU|BPF_END|BPF_TO_BE = 0xdc, imm 16
    a.label("x")
    a.jump_if(R1, "<", R0, "x", reg=True)  # BPF_JMP|BPF_JLT|BPF_X = 0xad, offset -1
    a.ld_imm64(R1, 0x1122334455667788)     # 0x18 then a second slot with the high half
    a.exit()
    insns = bpf_asm.disassemble(a.assemble())
    assert insns[0] == (0xB7, 0, 0, 0, -1)
    assert insns[1] == (0xBF, 6, 1, 0, 0)
    assert insns[2] == (0x61, 1, 6, 76, 0)
    assert insns[3] == (0xDB, 6, 1, 64, 0)
    assert insns[4] == (0xDC, 1, 0, 0, 16)
    assert insns[5] == (0xAD, 1, 0, -1, 0)
    assert insns[6] == (0x18, 1, 0, 0, 0x55667788)
    assert insns[7] == (0x00, 0, 0, 0, 0x11223344)
    assert insns[8] == (0x95, 0, 0, 0, 0)


def test_assembler_refuses_bad_labels():
    a = Asm()
    a.jump("nowhere")
    with pytest.raises(ValueError, match="undefined label"):
        a.assemble()
    a.label("here")
    with pytest.raises(ValueError, match="twice"):
        a.label("here")


def test_program_for_a_plan_is_well_formed():
    code = bpf_program.build("ingress", Match(), [(0, "10.201.0.2"), (1, "10.201.0.3")], 5)
    insns = bpf_asm.disassemble(code)
    assert len(code) % 8 == 0 and len(insns) < 4096
    assert insns[-1][0] == 0x95  # ends with exit
    # the map is referenced by fd through BPF_PSEUDO_MAP_FD
    assert any(op == 0x18 and src == bpf_asm.PSEUDO_MAP_FD and imm == 5
               for op, _, src, _, imm in insns)
    assert R10 == bpf_asm.FP


def test_thresholds_and_the_reference_generator():
    assert bpf_program.threshold(0) == 0
    assert bpf_program.threshold(1) == 2**32
    assert bpf_program.threshold(0.1) == round(0.1 * 2**32)
    draws = bpf_program.reference_draws(12345, 200_000)
    assert all(0 <= d < 2**32 for d in draws)
    assert bpf_program.reference_draws(12345, 5) == draws[:5]  # replayable
    # uniform: the fraction below the 10% threshold is 10% within 4 sigma (sigma ~ 0.067%)
    frac = sum(d < bpf_program.threshold(0.1) for d in draws) / len(draws)
    assert abs(frac - 0.1) < 4 * (0.1 * 0.9 / len(draws)) ** 0.5


def test_slot_values_pack_and_unpack():
    from testbed.profiles.model import GilbertElliott

    params = bpf_program.slot_params(GilbertElliott(p_pct=1, r_pct=20), rng_seed=7)
    value = bpf_program.decode_value(params.initial_value())
    assert value["model"] == bpf_program.MODEL_GE
    assert value["thr_p"] == bpf_program.threshold(0.01)
    assert value["thr_bad"] == 2**32 and value["thr_good"] == 0 and value["rng"] == 7
    assert len(params.initial_value()) == bpf_program.VALUE_SIZE


@given(st.integers(0, 65535), st.integers(0, 65535))
def test_port_prefixes_cover_exactly_the_range(a, b):
    first, last = min(a, b), max(a, b)
    prefixes = u32_match.range_to_prefixes(first, last)
    covered = set()
    for value, mask in prefixes:
        size = (~mask & 0xFFFF) + 1
        block = set(range(value, value + size))
        assert not covered & block  # no overlap
        covered |= block
    assert covered == set(range(first, last + 1))
    assert len(prefixes) <= 30  # at most 2 per bit


def test_wilson_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = random.Random(1)
    hits = 0
    trials = 400
    for _ in range(trials):
        k = sum(rng.random() < 0.1 for _ in range(2000))
        lo, hi = stats.wilson_interval(k, 2000)
        hits += lo <= 0.1 <= hi
    # Binomial(400, 0.95): mean 380, sd 4.4; 360 is 4.6 sd below (odds ~2e-6 of a false fail)
    assert hits >= 360


def test_wilson_interval_is_the_textbook_one_and_inflation_shrinks_the_sample():
    # Wilson 95% of 10 in 100 (textbook value); mutation caught: a Wald interval (0.041,
    # 0.159), or inflation ignored
    assert stats.wilson_interval(10, 100) == pytest.approx((0.0552, 0.1744), abs=1e-4)
    assert stats.wilson_interval(10, 100, inflation=2.0) == stats.wilson_interval(5, 50)
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def test_markov_inflation():
    assert stats.markov_inflation(0.5, 0.5) == 1.0  # independent
    assert stats.markov_inflation(0.0111, 0.1) == pytest.approx((2 - 0.1111) / 0.1111)
    assert stats.sigma_distance(100, 1000, 0.1) == 0
