"""Templates over the file system and configuration: rename, archive, clean, configure."""

from __future__ import annotations

import random

from services.domains.terminal.base import (
    NAMES,
    Check,
    Made,
    file_is,
    lines_are,
    only,
    output_is,
    output_lines,
    pairs_are,
    succeeds,
)


def config_port(rng: random.Random) -> Made:
    service = rng.choice(NAMES)
    old, new = rng.sample(range(1024, 9999), 2)
    host = f"{rng.choice(NAMES)}.internal"
    text = f"[server]\nname = {service}\nhost = {host}\nport = {old}\n\n[log]\nlevel = info\n"
    wanted = text.replace(f"port = {old}", f"port = {new}").strip().splitlines()
    return Made(
        values=f"{service}:{old}:{new}",
        prompt=f"The service in conf/{service}.ini must listen on port {new}. Change its port "
        "and nothing else.",
        files={f"conf/{service}.ini": text},
        checks=only(
            name="port",
            message=f"conf/{service}.ini is not the config with port {new}",
            probe=lines_are(f"conf/{service}.ini", wanted),
        ),
        solution=(f"sed -i 's/^port = {old}$/port = {new}/' conf/{service}.ini",),
    )


def env_key(rng: random.Random) -> Made:
    keys = {
        f"{n.upper()}_URL": f"http://{n}:{rng.randint(1000, 9000)}" for n in rng.sample(NAMES, 3)
    }
    missing = f"{rng.choice(NAMES).upper()}_TOKEN"
    value = f"{rng.randint(10**7, 10**8 - 1)}"
    env = "".join(f"{k}={v}\n" for k, v in keys.items())
    check = pairs_are(".env", {**keys, missing: value})
    return Made(
        values=f"{missing}:{value}",
        prompt=f"The app reads its settings from .env. Add {missing} with the value {value}, "
        "keeping the other settings.",
        files={".env": env},
        checks=only(
            name="env",
            message=f".env does not hold {missing}={value} and the rest",
            probe=check,
        ),
        solution=(f"echo '{missing}={value}' >> .env",),
    )


def rename_extension(rng: random.Random) -> Made:
    names = rng.sample(NAMES, rng.randint(3, 6))
    files = {f"docs/{n}.txt": f"{n}\n" for n in names}
    files["docs/keep.rst"] = "keep\n"
    wanted = sorted([*(f"{n}.md" for n in names), "keep.rst"])
    return Made(
        values=",".join(names),
        prompt="Rename every .txt file in docs/ to the same name with the .md extension. "
        "Leave the other files alone.",
        files=files,
        checks=only(
            name="names",
            message="docs/ does not hold exactly the renamed files",
            probe=output_lines("ls docs | sort", wanted),
        ),
        solution=('for f in docs/*.txt; do mv "$f" "${f%.txt}.md"; done',),
    )


def archive(rng: random.Random) -> Made:
    names = sorted(rng.sample(NAMES, rng.randint(2, 5)))
    files = {f"reports/{n}.txt": f"report {n} {rng.randint(1, 99)}\n" for n in names}
    # tar's exit status is lost in the pipe, and an unreadable archive lists nothing.
    listed = output_lines(
        "tar -tzf reports.tar.gz | grep '\\.txt$' | sort", [f"reports/{n}.txt" for n in names]
    )
    return Made(
        values=",".join(names),
        prompt="Pack the reports/ directory into a gzip-compressed tar archive reports.tar.gz "
        "(paths inside it starting with reports/).",
        files=files,
        checks=(
            Check(name="archive", message="reports.tar.gz does not hold the reports", probe=listed),
        ),
        solution=("tar czf reports.tar.gz reports",),
    )


def largest_file(rng: random.Random) -> Made:
    sizes = rng.sample(range(10, 400), 5)
    names = rng.sample(NAMES, 5)
    files = {f"blobs/{n}.bin": "x" * s for n, s in zip(names, sizes, strict=True)}
    top = names[sizes.index(max(sizes))]
    return Made(
        values=f"{top}",
        prompt="Which file in blobs/ is the largest? Write its file name (like name.bin) "
        "to largest.txt.",
        files=files,
        checks=only(
            name="largest",
            message="largest.txt does not name the largest file",
            probe=file_is("largest.txt", f"{top}.bin"),
        ),
        solution=("ls -S blobs | head -1 > largest.txt",),
    )


def clean_temporary(rng: random.Random) -> Made:
    names = rng.sample(NAMES, 6)
    files = {}
    for i, n in enumerate(names):
        folder = "build" if i % 2 else "build/cache"
        files[f"{folder}/{n}.tmp"] = "scratch\n"
        files[f"{folder}/{n}.o"] = "object\n"
    kept = sorted(p for p in files if p.endswith(".o"))
    return Made(
        values=",".join(names),
        prompt="Delete every .tmp file under build/ (in any subdirectory); keep all other files.",
        files=files,
        checks=(
            Check(
                name="cleaned",
                message="build/ does not hold exactly the non-.tmp files",
                probe=output_lines("find build -type f | sort", kept),
            ),
        ),
        solution=("find build -name '*.tmp' -delete",),
    )


def executable_script(rng: random.Random) -> Made:
    word = rng.choice(NAMES)
    return Made(
        values=word,
        prompt="Make tools/greet.sh executable, then run it as ./tools/greet.sh so it writes "
        "greeting.txt.",
        files={"tools/greet.sh": f"#!/bin/bash\necho hello {word} > greeting.txt\n"},
        checks=(
            Check(
                name="executable",
                message="tools/greet.sh is not executable",
                probe=succeeds("[ -x tools/greet.sh ]"),
            ),
            Check(
                name="ran",
                message=f"greeting.txt does not say hello {word}",
                probe=file_is("greeting.txt", f"hello {word}"),
            ),
        ),
        solution=("chmod +x tools/greet.sh", "./tools/greet.sh"),
    )


def symlink_latest(rng: random.Random) -> Made:
    versions = sorted(rng.sample(range(1, 30), 4))
    files = {f"releases/v{v}/VERSION": f"{v}\n" for v in versions}
    latest = f"releases/v{versions[-1]}"
    return Made(
        values=",".join(map(str, versions)),
        prompt="Create a symbolic link named current pointing to the newest release directory "
        "under releases/ (the highest version number), as the relative path releases/vN.",
        files=files,
        checks=only(
            name="link",
            message=f"current is not a symlink to {latest}",
            probe=output_is("[ -L current ] && readlink current", latest),
        ),
        solution=("ln -s $(ls -d releases/v* | sort -t v -k2 -n | tail -1) current",),
    )


def private_key(rng: random.Random) -> Made:
    name = f"{rng.choice(NAMES)}.key"
    return Made(
        values=name,
        prompt=f"keys/{name} is readable by everyone. Make it readable and writable by its "
        "owner only (mode 600).",
        files={f"keys/{name}": f"secret-{rng.randint(10**5, 10**6)}\n"},
        checks=only(
            name="mode",
            message=f"keys/{name} is not mode 600",
            probe=output_is(f"stat -c %a keys/{name}", "600"),
        ),
        solution=(f"chmod 600 keys/{name}",),
    )


def scaffold(rng: random.Random) -> Made:
    package = rng.choice(NAMES)
    version = f"{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    return Made(
        values=f"{package}:{version}",
        prompt=f"Create the layout of a Python package named {package}: a directory "
        f"{package}/ with an empty __init__.py, a file {package}/VERSION holding {version}, "
        "and an empty directory tests/. The spec is in SPEC.txt too.",
        files={"SPEC.txt": f"package: {package}\nversion: {version}\n"},
        checks=(
            Check(
                name="init",
                message=f"{package}/__init__.py is missing or not empty",
                probe=succeeds(f"[ -f {package}/__init__.py ] && [ ! -s {package}/__init__.py ]"),
            ),
            Check(
                name="version",
                message=f"{package}/VERSION does not hold {version}",
                probe=file_is(f"{package}/VERSION", version),
            ),
            Check(
                name="tests", message="tests/ is not a directory", probe=succeeds("[ -d tests ]")
            ),
        ),
        solution=(
            f"mkdir -p {package} tests && touch {package}/__init__.py && "
            f"echo {version} > {package}/VERSION",
        ),
    )


TEMPLATES = {
    "config_port": config_port,
    "env_key": env_key,
    "rename_extension": rename_extension,
    "archive": archive,
    "largest_file": largest_file,
    "clean_temporary": clean_temporary,
    "executable_script": executable_script,
    "symlink_latest": symlink_latest,
    "private_key": private_key,
    "scaffold": scaffold,
}
