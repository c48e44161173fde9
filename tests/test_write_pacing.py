"""Writes yield to searches: the pacer's arithmetic on a fake clock, its order and bound, and the service's use of it."""

from __future__ import annotations

import asyncio

import pytest

from densehybrid.service.errors import QueueFull
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.pipeline import Pipeline
from densehybrid.service.write_pacing import WritePacer


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _write(pacer: WritePacer, clock: FakeClock, busy_s: float, idle_s: float = 0.0) -> None:
    async with pacer.writing() as idle:
        clock.now += busy_s + idle_s
        idle(idle_s)


@pytest.mark.parametrize("share, expected_s", [(0.5, 0.2), (0.25, 0.6), (0.1, 1.8), (1.0, 0.0)])
def test_while_searches_run_the_next_write_waits_its_busy_time_times_the_others_share(share, expected_s):
    clock = FakeClock()
    pacer = WritePacer(share, clock=clock)
    with pacer.reading():
        asyncio.run(_write(pacer, clock, busy_s=0.2))
        assert pacer.hold_back_s() == pytest.approx(expected_s)
        clock.now += expected_s / 2
        assert pacer.hold_back_s() == pytest.approx(expected_s / 2)


def test_without_searches_writes_never_wait():
    clock = FakeClock()
    pacer = WritePacer(0.1, clock=clock)
    asyncio.run(_write(pacer, clock, busy_s=1.0))
    assert pacer.hold_back_s() == 0.0
    with pacer.reading():  # a search that starts afterwards brings the hold-back back
        assert pacer.hold_back_s() == pytest.approx(9.0)
        clock.now += 0.5
    assert pacer.hold_back_s() == pytest.approx(8.5)  # it finished after the last write: searches are running
    asyncio.run(_write(pacer, clock, busy_s=0.0))
    assert pacer.hold_back_s() == 0.0  # no search since that write


def test_time_a_write_spent_waiting_behind_searches_is_not_counted_as_busy():
    clock = FakeClock()
    pacer = WritePacer(0.5, clock=clock)
    with pacer.reading():
        asyncio.run(_write(pacer, clock, busy_s=0.1, idle_s=5.0))
        assert pacer.hold_back_s() == pytest.approx(0.1)


def test_writes_take_turns_in_arrival_order_and_wait_out_the_hold_back():
    pacer = WritePacer(0.5)
    events = []

    async def write(name: str, busy_s: float) -> None:
        async with pacer.writing():
            events.append(("start", name, asyncio.get_running_loop().time()))
            await asyncio.sleep(busy_s)
            events.append(("end", name, asyncio.get_running_loop().time()))

    async def main() -> None:
        with pacer.reading():
            await asyncio.gather(write("a", 0.05), write("b", 0.0), write("c", 0.0))

    asyncio.run(main())
    assert [e[:2] for e in events] == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"),
                                       ("start", "c"), ("end", "c")]
    a_end, b_start = events[1][2], events[2][2]
    assert b_start - a_end >= 0.05 * 0.9  # a kept the server busy 50 ms: b waited as long (share 0.5)


def test_a_full_line_of_waiting_writes_is_refused_with_429_and_the_line_drains():
    metrics = ServiceMetrics()
    pipeline = Pipeline(None, None, None, None, None, metrics, timeout_s=1.0, retry_after_s=3,
                        pacer=WritePacer(1.0, max_waiting=1))

    async def main() -> list:
        release = asyncio.Event()

        async def hold() -> None:
            async with pipeline.write_turn():
                await release.wait()

        async def queued() -> str:
            async with pipeline.write_turn():
                return "written"

        holder = asyncio.ensure_future(hold())
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(queued())
        await asyncio.sleep(0)
        assert pipeline.pacer.waiting == 1
        with pytest.raises(QueueFull) as refused:
            async with pipeline.write_turn():
                pass
        release.set()
        return [refused.value, await holder, await waiter]

    refused, _, written = asyncio.run(main())
    assert refused.status == 429 and refused.headers == {"Retry-After": "3"} and "waiting their turn" in str(refused)
    assert written == "written" and pipeline.pacer.waiting == 0
    assert metrics.rejected.labels(reason="writes_backlogged")._value.get() == 1
    assert metrics.registry.get_sample_value("densehybrid_write_turn_wait_seconds_count") == 2  # the refused one took no turn


def test_a_write_that_fails_still_sets_the_hold_back_and_frees_the_lane():
    clock = FakeClock()
    pacer = WritePacer(0.5, clock=clock)

    async def failing() -> None:
        async with pacer.writing():
            clock.now += 0.3
            raise RuntimeError("disk")

    with pacer.reading():
        with pytest.raises(RuntimeError):
            asyncio.run(failing())
        assert pacer.hold_back_s() == pytest.approx(0.3)
    asyncio.run(_write(pacer, clock, busy_s=0.0))  # the lane is free


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="share"):
        WritePacer(share)
