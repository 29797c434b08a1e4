"""The Tinker service's engine requests go to clients in turn (orchestration/service/fair_share.py): a client that
queued many samples does not make another's one sample wait behind all of them. Fails on the old main, where the
engines' thread pool took requests first come, first served."""

from __future__ import annotations

import asyncio

from orchestration.service.fair_share import FairShare


def run_order(limit: int, arrivals: list[str]) -> list[str]:
    """The order in which requests of `arrivals` (client names, in the order sent) reach the engines."""
    fair, started = FairShare(limit), []

    async def request(client: str, i: int) -> None:
        async with fair.turn(client):
            started.append(f"{client}{i}")
            await asyncio.sleep(0.01)

    async def main() -> None:
        await asyncio.gather(*(request(c, i) for i, c in enumerate(arrivals)))

    asyncio.run(main())
    return started


def test_a_late_client_goes_next_not_after_the_flood():
    order = run_order(1, ["a"] * 6 + ["b"])
    assert order[:3] == ["a0", "a1", "b6"], order  # a0 ran, a1 first waiting, then b's turn
    assert order[3:] == ["a2", "a3", "a4", "a5"]


def test_clients_alternate_and_each_keeps_its_own_order():
    order = run_order(2, ["a", "a", "a", "a", "b", "b", "c"])
    assert order[:2] == ["a0", "a1"]
    waiting = order[2:]
    assert waiting[:3] == ["a2", "b4", "c6"], order
    assert [x for x in waiting if x[0] == "a"] == ["a2", "a3"] and [x for x in waiting if x[0] == "b"] == ["b4", "b5"]


def test_a_cancelled_wait_gives_its_turn_away_and_no_slot_is_lost():
    async def main() -> list[str]:
        fair, started = FairShare(1), []

        async def request(client: str, hold: float) -> None:
            async with fair.turn(client):
                started.append(client)
                await asyncio.sleep(hold)

        first = asyncio.create_task(request("a", 0.05))
        await asyncio.sleep(0)
        gone = asyncio.create_task(request("b", 0.0))
        late = asyncio.create_task(request("c", 0.0))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.gather(first, late, return_exceptions=True)
        assert fair.waiting == {} and fair._running == 0
        async with fair.turn("d"):  # the slot is free again
            started.append("d")
        return started

    assert asyncio.run(main()) == ["a", "c", "d"]
