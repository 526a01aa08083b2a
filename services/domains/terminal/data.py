"""Templates over data files: CSV, JSON and plain numbers to transform or summarise."""

from __future__ import annotations

import json
import random

from services.domains.terminal.base import (
    NAMES,
    PEOPLE,
    Made,
    file_is,
    json_is,
    lines_are,
    only,
)


def _table(rng: random.Random, rows: int) -> list[tuple[int, str, int]]:
    return [(i + 1, rng.choice(PEOPLE), rng.randint(1, 900)) for i in range(rows)]


def _csv(rows: list[tuple[int, str, int]], header: str = "id,owner,amount") -> str:
    return header + "\n" + "".join(f"{i},{o},{a}\n" for i, o, a in rows)


def csv_sum(rng: random.Random) -> Made:
    rows = _table(rng, rng.randint(8, 20))
    owner = rng.choice([o for _, o, _ in rows])
    total = sum(a for _, o, a in rows if o == owner)
    return Made(
        values=f"{owner}:{total}",
        prompt=f"sales.csv has the columns id,owner,amount. Write the total amount of the "
        f"rows whose owner is {owner} to total.txt.",
        files={"sales.csv": _csv(rows)},
        checks=only(
            name="total",
            message=f"total.txt does not hold {owner}'s total",
            probe=file_is("total.txt", str(total)),
        ),
        solution=(f"awk -F, '$2==\"{owner}\" {{s+=$3}} END {{print s}}' sales.csv > total.txt",),
    )


def csv_filter(rng: random.Random) -> Made:
    rows = _table(rng, rng.randint(10, 20))
    threshold = sorted(a for _, _, a in rows)[len(rows) // 2]
    kept = [f"{i},{o},{a}" for i, o, a in rows if a > threshold]
    return Made(
        values=str(threshold),
        prompt=f"Write the rows of orders.csv whose amount (third column) is greater than "
        f"{threshold} to big.csv, header line first, in their original order.",
        files={"orders.csv": _csv(rows)},
        checks=only(
            name="big_rows",
            message="big.csv is not the header plus the big rows",
            probe=lines_are("big.csv", ["id,owner,amount", *kept]),
        ),
        solution=(f"awk -F, 'NR==1 || $3>{threshold}' orders.csv > big.csv",),
    )


def csv_join(rng: random.Random) -> Made:
    ids = rng.sample(range(100, 999), 6)
    names = {i: rng.choice(PEOPLE) for i in ids}
    cities = {i: rng.choice(NAMES) for i in ids}
    left = "id,name\n" + "".join(f"{i},{names[i]}\n" for i in ids)
    shuffled = list(ids)
    rng.shuffle(shuffled)
    right = "id,city\n" + "".join(f"{i},{cities[i]}\n" for i in shuffled)
    joined = ["id,name,city", *(f"{i},{names[i]},{cities[i]}" for i in sorted(ids))]
    return Made(
        values=",".join(map(str, ids)),
        prompt="Join people.csv (id,name) and cities.csv (id,city) on id into joined.csv "
        "with the header id,name,city and the rows sorted by id.",
        files={"people.csv": left, "cities.csv": right},
        checks=only(
            name="joined",
            message="joined.csv is not the sorted join on id",
            probe=lines_are("joined.csv", joined),
        ),
        solution=(
            "python3 -c \"import csv; a={r['id']: r['name'] for r in csv.DictReader(open("
            "'people.csv'))}; b={r['id']: r['city'] for r in csv.DictReader(open('cities.csv'))}"
            "; print('id,name,city'); [print(f'{k},{a[k]},{b[k]}') for k in sorted(a)]\" "
            "> joined.csv",
        ),
    )


def swap_columns(rng: random.Random) -> Made:
    rows = [(rng.choice(NAMES), rng.randint(1, 99)) for _ in range(rng.randint(5, 10))]
    text = "".join(f"{a}\t{b}\n" for a, b in rows)
    swapped = [f"{b}\t{a}" for a, b in rows]
    return Made(
        values=text,
        prompt="pairs.tsv has two tab-separated columns. Swap them in place, so each line "
        "holds the second column, a tab, then the first.",
        files={"pairs.tsv": text},
        checks=only(
            name="swapped",
            message="pairs.tsv's columns are not swapped",
            probe=lines_are("pairs.tsv", swapped),
        ),
        solution=(
            "awk -F'\\t' -v OFS='\\t' '{print $2, $1}' pairs.tsv > p.new && mv p.new pairs.tsv",
        ),
    )


def json_set(rng: random.Random) -> Made:
    initial = rng.randint(1, 8)
    settings: dict[str, object] = {
        "name": rng.choice(NAMES),
        "workers": initial,
        "debug": True,
        "paths": {"data": f"/srv/{rng.choice(NAMES)}", "cache": "/tmp/cache"},
    }
    workers = initial + rng.randint(2, 6)
    wanted = {**settings, "workers": workers, "debug": False}
    return Made(
        values=f"{settings['name']}:{workers}",
        prompt=f"In settings.json, set workers to {workers} and debug to false; keep every "
        "other setting as it is. The file must stay valid JSON.",
        files={"settings.json": json.dumps(settings, indent=2) + "\n"},
        checks=only(
            name="settings",
            message="settings.json is not the settings asked for",
            probe=json_is("settings.json", wanted),
        ),
        solution=(
            "python3 -c \"import json; d=json.load(open('settings.json')); "
            f"d['workers']={workers}; d['debug']=False; "
            "json.dump(d, open('settings.json', 'w'), indent=2)\"",
        ),
    )


def json_repair(rng: random.Random) -> Made:
    items = {rng.choice(NAMES): rng.randint(1, 50) for _ in range(4)}
    lines = [f'  "{k}": {v},' for k, v in items.items()]  # the last comma is the bug
    broken = "{\n" + "\n".join(lines) + "\n}\n"
    last = lines[-1]
    return Made(
        values=json.dumps(items),
        prompt="inventory.json does not parse. Fix the syntax error without changing "
        "any key or value.",
        files={"inventory.json": broken},
        checks=only(
            name="parses",
            message="inventory.json does not parse to the same inventory",
            probe=json_is("inventory.json", items),
        ),
        solution=(f"sed -i 's/^{last}$/{last[:-1]}/' inventory.json",),
    )


def json_to_csv(rng: random.Random) -> Made:
    stock = [(f"{rng.choice(NAMES)}-{i}", rng.randint(0, 40)) for i in range(6)]
    records = [{"sku": sku, "qty": qty} for sku, qty in stock]
    wanted = ["sku,qty", *(f"{sku},{qty}" for sku, qty in stock if qty > 0)]
    return Made(
        values=json.dumps(records),
        prompt="stock.json is a list of {sku, qty} records. Write stock.csv with the header "
        "sku,qty and one line per record whose qty is above 0, in the list's order.",
        files={"stock.json": json.dumps(records) + "\n"},
        checks=only(
            name="csv",
            message="stock.csv is not the records in stock",
            probe=lines_are("stock.csv", wanted),
        ),
        solution=(
            "python3 -c \"import json; print('sku,qty'); [print(r['sku'] + ',' + str(r['qty']))"
            " for r in json.load(open('stock.json')) if r['qty'] > 0]\" > stock.csv",
        ),
    )


def sum_files(rng: random.Random) -> Made:
    files = {}
    total = 0
    for name in rng.sample(NAMES, rng.randint(3, 6)):
        numbers = [rng.randint(-50, 200) for _ in range(rng.randint(2, 6))]
        total += sum(numbers)
        files[f"parts/{name}.txt"] = "\n".join(map(str, numbers)) + "\n"
    return Made(
        values=str(total),
        prompt="Each file in parts/ holds integers, one a line. Write the sum of all of them "
        "to sum.txt.",
        files=files,
        checks=only(
            name="sum",
            message="sum.txt does not hold the sum of every number",
            probe=file_is("sum.txt", str(total)),
        ),
        solution=("cat parts/*.txt | awk '{s+=$1} END {print s}' > sum.txt",),
    )


TEMPLATES = {
    "csv_sum": csv_sum,
    "csv_filter": csv_filter,
    "csv_join": csv_join,
    "swap_columns": swap_columns,
    "json_set": json_set,
    "json_repair": json_repair,
    "json_to_csv": json_to_csv,
    "sum_files": sum_files,
}
