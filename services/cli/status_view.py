"""What ``temper status`` prints for a StackStatus: instances, streams, dead letters.

An instance silent past the control service's bound reads ``gone`` (its last state is
no longer news); a generator shows the policy version it serves, and ``lagging`` when
it stayed behind the newest announced one too long.  ``METRICS`` is the instance's
Prometheus endpoint (``-`` when it serves none).
"""

from __future__ import annotations

from protocol.messages import ServiceStatus, StackStatus


def status_lines(url: str, status: StackStatus) -> list[str]:
    lines = [
        f"NATS         {url}  ok",
        f"{'SERVICE':<12} {'INSTANCE':<24} {'STATE':<9} {'HEALTH':<10} {'POLICY':<14} "
        f"{'IN-FLIGHT':>9}  {'LAST SEEN':>9}  METRICS",
    ]
    lines.extend(_instance_line(s) for s in status.services)
    lines.append(f"{'STREAM':<20} {'MESSAGES':>9} {'BYTES':>12} {'CONSUMERS':>9} {'PENDING':>8}")
    for st in status.streams:
        lines.append(
            f"{st.name:<20} {st.messages:>9} {st.bytes:>12} {st.consumers:>9} {st.pending:>8}"
        )
    hint = "  (temper dlq list)" if status.dead_letters else ""
    lines.append(f"dead letters: {status.dead_letters}{hint}")
    return lines


def print_status(url: str, status: StackStatus) -> None:
    for line in status_lines(url, status):
        print(line)


def _instance_line(s: ServiceStatus) -> str:
    state = "gone" if s.gone else s.state.value
    health = "-" if s.gone else ("healthy" if s.healthy else "UNHEALTHY")
    line = (
        f"{s.service:<12} {s.instance:<24} {state:<9} {health:<10} {_policy(s):<14} "
        f"{s.in_flight:>9}  {s.age_s:>8.1f}s  {s.metrics_url or '-':<30}"
    )
    return (line + (f"  {s.detail}" if s.detail else "")).rstrip()


def _policy(s: ServiceStatus) -> str:
    if s.policy_version is None:
        return "-"
    return f"v{s.policy_version}" + (" lagging" if s.lagging else "")
