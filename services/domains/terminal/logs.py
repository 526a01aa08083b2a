"""Templates over logs and text: count, find, extract, summarise."""

from __future__ import annotations

import random
from collections import Counter

from services.domains.terminal.base import NAMES, Check, Made, file_is, lacks, lines_are, only

LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")


def _log_lines(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    """(time, level, message) lines, in time order."""
    lines = []
    for i in range(n):
        stamp = f"2024-05-{rng.randint(1, 28):02d}T{i // 60 % 24:02d}:{i % 60:02d}:00"
        level = rng.choice(LEVELS)
        lines.append((stamp, level, f"{rng.choice(NAMES)} request {rng.randint(100, 999)}"))
    return lines


def count_errors(rng: random.Random) -> Made:
    name = f"{rng.choice(NAMES)}.log"
    lines = _log_lines(rng, rng.randint(30, 60))
    count = sum(level == "ERROR" for _, level, _ in lines)
    text = "".join(f"{t} [{lv}] {m}\n" for t, lv, m in lines)
    return Made(
        values=f"{name}:{count}",
        prompt=f"How many lines of logs/{name} have the level ERROR? Write the number "
        "alone to error_count.txt in the working directory.",
        files={f"logs/{name}": text},
        checks=only(
            name="count",
            message="error_count.txt does not hold the number of ERROR lines",
            probe=file_is("error_count.txt", str(count)),
        ),
        solution=(f"grep -c '\\[ERROR\\]' logs/{name} > error_count.txt",),
    )


def top_ip(rng: random.Random) -> Made:
    ips = [f"10.0.{rng.randint(0, 9)}.{rng.randint(1, 254)}" for _ in range(6)]
    weights = list(range(1, 7))
    rng.shuffle(weights)
    hits = [ip for ip, w in zip(ips, weights, strict=True) for _ in range(w * 3)]
    rng.shuffle(hits)
    counts = Counter(hits).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        hits.append(counts[0][0])  # no tie for the top
    top = Counter(hits).most_common(1)[0][0]
    text = "".join(f'{ip} - - "GET /{rng.choice(NAMES)} HTTP/1.1" 200\n' for ip in hits)
    return Made(
        values=top,
        prompt="access.log is a web server log, one request a line starting with the "
        "client address. Write the address that made the most requests to top_ip.txt.",
        files={"access.log": text},
        checks=only(
            name="top_ip",
            message="top_ip.txt does not hold the busiest client",
            probe=file_is("top_ip.txt", top),
        ),
        solution=(
            "awk '{print $1}' access.log | sort | uniq -c | sort -rn | head -1 "
            "| awk '{print $2}' > top_ip.txt",
        ),
    )


def time_window(rng: random.Random) -> Made:
    lines = _log_lines(rng, rng.randint(40, 80))
    start, end = sorted(rng.sample(range(len(lines)), 2))
    low, high = lines[start][0][11:16], lines[end][0][11:16]
    inside = sum(low <= t[11:16] <= high for t, _, _ in lines)
    text = "".join(f"{t} {lv} {m}\n" for t, lv, m in lines)
    return Made(
        values=f"{low}-{high}",
        prompt=f"events.log has one event a line, each starting with an ISO timestamp. "
        f"Count the events whose time of day (HH:MM) is between {low} and {high}, both "
        "included, and write the count to window.txt.",
        files={"events.log": text},
        checks=only(
            name="window",
            message="window.txt does not hold the count in the window",
            probe=file_is("window.txt", str(inside)),
        ),
        solution=(
            f'awk \'{{t=substr($1,12,5)}} t>="{low}" && t<="{high}"\' events.log '
            "| wc -l > window.txt",
        ),
    )


def word_frequency(rng: random.Random) -> Made:
    words = rng.sample(NAMES, 6)
    counts = rng.sample(range(2, 12), 6)
    bag = [w for w, c in zip(words, counts, strict=True) for _ in range(c)]
    rng.shuffle(bag)
    text = "\n".join(" ".join(bag[i : i + 7]) for i in range(0, len(bag), 7)) + "\n"
    top = words[counts.index(max(counts))]
    return Made(
        values=top,
        prompt="Which word occurs most often in notes.txt? Write it to top_word.txt.",
        files={"notes.txt": text},
        checks=only(
            name="top_word",
            message="top_word.txt does not hold the most frequent word",
            probe=file_is("top_word.txt", top),
        ),
        solution=(
            "tr -s ' ' '\\n' < notes.txt | grep -v '^$' | sort | uniq -c | sort -rn "
            "| head -1 | awk '{print $2}' > top_word.txt",
        ),
    )


def extract_field(rng: random.Random) -> Made:
    users = rng.sample(NAMES, 8)
    ids = {u: rng.randint(1000, 9999) for u in users}
    shells = {u: rng.choice(("/bin/bash", "/bin/sh", "/usr/sbin/nologin")) for u in users}
    shells[users[0]] = "/bin/bash"  # at least one to find
    text = "".join(f"{u}:x:{ids[u]}:{ids[u]}::/home/{u}:{shells[u]}\n" for u in users)
    wanted = sorted(u for u in users if shells[u] == "/bin/bash")
    return Made(
        values=",".join(wanted),
        prompt="users.txt is in /etc/passwd format. Write the names of the users whose "
        "shell is /bin/bash to bash_users.txt, one a line, sorted alphabetically.",
        files={"users.txt": text},
        checks=only(
            name="bash_users",
            message="bash_users.txt does not list exactly the bash users in order",
            probe=lines_are("bash_users.txt", wanted),
        ),
        solution=("awk -F: '$7==\"/bin/bash\" {print $1}' users.txt | sort > bash_users.txt",),
    )


def grep_todo(rng: random.Random) -> Made:
    names = rng.sample(NAMES, 6)
    marked = sorted(rng.sample(names, 3))
    files = {}
    for n in names:
        body = f"def {n}():\n    return {rng.randint(1, 99)}\n"
        if n in marked:
            body = f"# TODO: handle {rng.choice(NAMES)}\n{body}"
        files[f"src/{n}.py"] = body
    wanted = [f"src/{n}.py" for n in marked]
    return Made(
        values=",".join(wanted),
        prompt="List the files under src/ that contain TODO, as paths like src/x.py, one a "
        "line and sorted, in todo.txt.",
        files=files,
        checks=only(
            name="todo",
            message="todo.txt does not list exactly the files with TODO",
            probe=lines_are("todo.txt", wanted),
        ),
        solution=("grep -rl TODO src | sort > todo.txt",),
    )


def dedupe_lines(rng: random.Random) -> Made:
    items = rng.sample(NAMES, 7)
    lines = [rng.choice(items) for _ in range(20)]
    seen: list[str] = []
    for line in lines:
        if line not in seen:
            seen.append(line)
    return Made(
        values=",".join(lines),
        prompt="Remove the repeated lines of queue.txt in place, keeping the first "
        "occurrence of each line and the original order.",
        files={"queue.txt": "\n".join(lines) + "\n"},
        checks=only(
            name="deduped",
            message="queue.txt is not the first occurrences in order",
            probe=lines_are("queue.txt", seen),
        ),
        solution=("awk '!seen[$0]++' queue.txt > queue.new && mv queue.new queue.txt",),
    )


def crlf(rng: random.Random) -> Made:
    name = f"{rng.choice(NAMES)}.csv"
    rows = [f"{rng.choice(NAMES)},{rng.randint(1, 500)}" for _ in range(rng.randint(5, 12))]
    text = "name,value\r\n" + "\r\n".join(rows) + "\r\n"
    clean = ["name,value", *rows]
    return Made(
        values=name,
        prompt=f"{name} has Windows (CRLF) line endings. Convert it in place to Unix (LF) "
        "line endings without changing its content otherwise.",
        files={name: text},
        checks=(
            Check(
                name="no_cr",
                message=f"{name} still holds carriage returns",
                probe=lacks(name, "\r"),
            ),
            Check(name="content", message=f"{name}'s rows changed", probe=lines_are(name, clean)),
        ),
        solution=(f"sed -i 's/\\r$//' {name}",),
    )


TEMPLATES = {
    "count_errors": count_errors,
    "top_ip": top_ip,
    "time_window": time_window,
    "word_frequency": word_frequency,
    "extract_field": extract_field,
    "grep_todo": grep_todo,
    "dedupe_lines": dedupe_lines,
    "crlf": crlf,
}
