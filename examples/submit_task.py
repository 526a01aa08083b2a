"""Submit one arithmetic task to a running Temper stack and print the receipt.

Usage: python examples/submit_task.py [nats://127.0.0.1:4222]
"""

import asyncio
import sys

from protocol.client import StackUnavailable, TemperClient
from protocol.messages import ChatMessage, Task


async def main(url: str) -> None:
    task = Task(
        id="arith-17-plus-25",
        domain="arithmetic",
        prompt=[ChatMessage(role="user", content="What is 17 + 25?")],
        metadata={"answer": "42"},
    )
    async with await TemperClient.connect(url) as client:
        print(await client.submit(task))


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "nats://127.0.0.1:4222"))
    except StackUnavailable as error:
        sys.exit(f"error: {error}")
