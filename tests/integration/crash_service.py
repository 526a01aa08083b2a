"""Run the test service in its own process, so a test can SIGKILL it mid-handling.

    python -m tests.integration.crash_service NATS_URL --signal SUBJECT \
        [--ack-wait S] [--max-deliver N] [--durable NAME]

Its handler announces each delivery by publishing ``<task id> <num_delivered>``
as a core NATS message on ``SUBJECT`` and then blocks forever: the message is
never acked, and only a kill ends the process.
"""

from __future__ import annotations

import argparse
import asyncio

from protocol.messages import Task
from services.runtime import Delivery
from tests.integration.support import DURABLE, TaskService, consumer_spec, runtime


async def main(
    url: str, signal_subject: str, ack_wait_s: float, max_deliver: int, durable: str
) -> None:
    service: TaskService

    async def announce_then_block(task: Task, delivery: Delivery) -> None:
        await service.bus.nc.publish(signal_subject, f"{task.id} {delivery.num_delivered}".encode())
        await service.bus.nc.flush()
        await asyncio.Event().wait()

    service = TaskService(
        runtime(url, instance="doomed"),
        announce_then_block,
        spec=consumer_spec(ack_wait_s=ack_wait_s, max_deliver=max_deliver, durable=durable),
    )
    async with service:
        await service.crashed.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("nats_url")
    parser.add_argument(
        "--signal", required=True, help="core NATS subject announcing each delivery"
    )
    parser.add_argument("--ack-wait", type=float, default=1.0)
    parser.add_argument("--max-deliver", type=int, default=5)
    parser.add_argument("--durable", default=DURABLE)
    args = parser.parse_args()
    asyncio.run(main(args.nats_url, args.signal, args.ack_wait, args.max_deliver, args.durable))
