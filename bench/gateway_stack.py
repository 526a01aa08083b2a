"""``temper up`` with a gateway, for the gateway benchmarks: a run directory of its own,
one API key, free ports, and a clean stop.  Shared by ``bench_gateway.py`` and
``bench_gateway_agent.py``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

KEY = "sk-bench-0123456789abcdef"
TEMPER = Path(sys.executable).with_name("temper")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayStack:
    """``services`` (the gateway among them) on the policy in ``RUN/model``, which
    ``place_model`` puts there; ``env`` adds the services' settings."""

    def __init__(
        self,
        prefix: str,
        services: Sequence[str],
        env: Mapping[str, str],
        place_model: Callable[[Path], None],
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.model = self.dir / "model"
        place_model(self.model)
        (self.dir / "keys.toml").write_text(f'[[keys]]\nkey = "{KEY}"\ntenant = "bench"\n')
        self.port, self.nats_port = free_port(), free_port()
        environment = {
            **os.environ,
            "TEMPER_GATEWAY_KEYS_FILE": str(self.dir / "keys.toml"),
            "TEMPER_GATEWAY_PORT": str(self.port),
            "TEMPER_GATEWAY_RATE_PER_S": "0",
            **env,
        }
        command = [str(TEMPER), "up", "--run-dir", str(self.dir), "--model", str(self.model)]
        command += [x for service in services for x in ("--service", service)]
        command += ["--nats-port", str(self.nats_port), "--no-metrics"]
        self.log = (self.dir / "up.log").open("w")
        self.proc = subprocess.Popen(
            command, env=environment, stdout=self.log, stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        """The gateway's OpenAI ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"temper up ended: see {self.dir / 'up.log'}")
            try:
                self.version()
                return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"the gateway did not answer within {timeout_s:g} s")

    def version(self) -> int:
        """The policy version the gateway serves."""
        request = urllib.request.Request(
            f"{self.url}/models", headers={"Authorization": f"Bearer {KEY}"}
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(json.load(answer)["data"][0]["policy_version"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
