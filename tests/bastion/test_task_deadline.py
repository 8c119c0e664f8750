"""The request timeout's deadline queue: one loop timer for every deadline of one timeout, bounded by the live ones."""

from __future__ import annotations

import asyncio

from bastion._task_deadline import COMPACT_SLACK, DeadlineQueue, TaskDeadline


def test_live_deadlines_expire_in_order_and_finished_ones_never() -> None:
    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        queue = DeadlineQueue(loop, timeout_secs=0.02)
        tasks = [asyncio.create_task(asyncio.sleep(5)) for _ in range(3)]
        deadlines = [TaskDeadline(task) for task in tasks]
        for deadline in deadlines:
            queue.add(deadline)
        queue.finish(deadlines[1])  # the middle request answered in time
        await asyncio.wait([tasks[0], tasks[2]], timeout=2)
        await asyncio.sleep(0)  # the middle one's deadline has passed too by then
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert len(queue) == 0 and queue.live == 0 and queue.timer is None
        return [deadline.expired for deadline in deadlines]

    assert asyncio.run(main()) == [True, False, True]


def test_finished_deadlines_behind_a_hung_one_stay_bounded() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        queue = DeadlineQueue(loop, timeout_secs=3600)
        hung = asyncio.create_task(asyncio.sleep(3600))
        queue.add(TaskDeadline(hung))  # holds the front for its whole timeout
        longest = 0
        for _ in range(5 * COMPACT_SLACK):
            deadline = TaskDeadline(hung)
            queue.add(deadline)
            longest = max(longest, len(queue))
            queue.finish(deadline)
        hung.cancel()
        assert queue.live == 1
        return longest

    assert asyncio.run(main()) <= 2 * 2 + COMPACT_SLACK + 1
