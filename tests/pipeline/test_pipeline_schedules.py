"""Schedule pricing: the textbook bubbles, microbatches in flight, zero-bubble filling."""

from __future__ import annotations

import pytest

from autoshard.pipeline.schedules import (
    TORCH_CLASS,
    Schedule,
    bubble_fraction,
    device_of_chunk,
    in_flight,
    step_time,
    virtual_stage_options,
)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (8, 64), (3, 1)])
def test_plain_bubble_is_textbook(schedule: Schedule, p: int, m: int) -> None:
    f, b = [1.0] * p, [2.0] * p
    assert bubble_fraction(schedule, f, b, m) == pytest.approx((p - 1) / (m + p - 1))
    assert step_time(schedule, f, b, m) == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (8, 64, 3), (2, 4, 4)])
def test_interleaving_divides_the_bubble_by_v(p: int, m: int, v: int) -> None:
    f, b = [1.0] * p, [2.0] * p
    plain = step_time(Schedule.ONE_F_ONE_B, f, b, m) - m * 3.0
    interleaved = step_time(Schedule.INTERLEAVED_1F1B, f, b, m, v) - m * 3.0
    assert interleaved == pytest.approx(plain / v)
    assert bubble_fraction(Schedule.INTERLEAVED_1F1B, f, b, m, v) == pytest.approx(
        (p - 1) / v / (m + (p - 1) / v)
    )


def test_unequal_stages_pay_the_slowest_per_microbatch() -> None:
    # Alpa's form: the first microbatch crosses every stage, the rest are paced by the slowest
    assert step_time(Schedule.ONE_F_ONE_B, [1.0, 2.0], [1.0, 2.0], 5) == pytest.approx(6.0 + 4 * 4.0)


def test_zero_bubble_fills_the_bubble_when_backward_is_twice_forward() -> None:
    f, b = [1.0] * 4, [2.0] * 4
    assert bubble_fraction(Schedule.ZB_V, f, b, 8, 2) == pytest.approx(0.0)
    # a backward shorter than the forward leaves a bubble zero-bubble schedules cannot fill
    assert bubble_fraction(Schedule.ZB_V, [2.0] * 4, [1.0] * 4, 8, 2) > 0


def test_in_flight_per_schedule() -> None:
    assert [in_flight(Schedule.ONE_F_ONE_B, d, 4, 1, 8) for d in range(4)] == [4, 3, 2, 1]
    assert in_flight(Schedule.ONE_F_ONE_B, 0, 4, 1, 2) == 2  # never more than the microbatches
    assert in_flight(Schedule.GPIPE, 3, 4, 1, 8) == 8
    # Megatron's interleaved warm-up on device 0: 2 (p - 1) + (v - 1) p chunks, + 1, in units of v chunks
    assert in_flight(Schedule.INTERLEAVED_1F1B, 0, 4, 2, 8) == pytest.approx((6 + 4 + 1) / 2)
    assert in_flight(Schedule.ZB_V, 2, 4, 2, 8) == 4


def test_chunks_and_torch_classes() -> None:
    assert [device_of_chunk(Schedule.ZB_V, c, 3) for c in range(6)] == [0, 1, 2, 2, 1, 0]
    assert [device_of_chunk(Schedule.INTERLEAVED_1F1B, c, 3) for c in range(6)] == [0, 1, 2, 0, 1, 2]
    assert virtual_stage_options(Schedule.ONE_F_ONE_B, 4, 8) == (1,)
    assert virtual_stage_options(Schedule.INTERLEAVED_1F1B, 4, 8) == (2,)
    assert virtual_stage_options(Schedule.ZB_V, 4, 7) == ()
    import torch.distributed.pipelining.schedules as torch_schedules

    for name in TORCH_CLASS.values():
        assert hasattr(torch_schedules, name), name


def test_only_what_torch_runs_is_priced() -> None:
    from autoshard.pipeline.schedules import torch_refuses

    assert torch_refuses(Schedule.ONE_F_ONE_B, 4, 1, 2) is not None
    assert torch_refuses(Schedule.ONE_F_ONE_B, 4, 1, 4) is None
    assert torch_refuses(Schedule.INTERLEAVED_1F1B, 4, 2, 10) is None  # 2 rounds of 5
    assert torch_refuses(Schedule.INTERLEAVED_1F1B, 4, 2, 9) is not None  # 2 rounds do not divide 9
    assert torch_refuses(Schedule.GPIPE, 8, 1, 1) is None
