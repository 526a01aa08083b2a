"""Templates over broken code: a build to fix, a bug to find, a failing test to make pass."""

from __future__ import annotations

import random

from services.domains.terminal.base import NAMES, Check, Made, file_is, only, output_is, q, succeeds


def python_off_by_one(rng: random.Random) -> Made:
    n = rng.randint(5, 30)
    name = f"{rng.choice(NAMES)}_sum.py"
    code = (
        "import sys\n\n\ndef total(n):\n    # the sum 1 + 2 + ... + n\n"
        "    return sum(range(1, n))\n\n\nprint(total(int(sys.argv[1])))\n"
    )
    return Made(
        values=f"{name}:{n}",
        prompt=f"`python3 {name} N` should print the sum 1 + 2 + ... + N, but `python3 {name} "
        f"{n}` prints the wrong number. Fix the bug in {name}.",
        files={name: code},
        checks=(
            Check(
                name="given",
                message=f"python3 {name} {n} does not print {n * (n + 1) // 2}",
                probe=output_is(f"python3 {name} {n}", str(n * (n + 1) // 2)),
            ),
            Check(
                name="other",
                message=f"python3 {name} 100 does not print 5050",
                probe=output_is(f"python3 {name} 100", "5050"),
            ),
        ),
        solution=(f"sed -i 's/range(1, n)/range(1, n + 1)/' {name}",),
    )


def cpp_missing_include(rng: random.Random) -> Made:
    words = rng.sample(NAMES, 4)
    listed = ", ".join(f'"{w}"' for w in words)
    code = (
        "#include <iostream>\n\nint main() {\n"
        f"    std::vector<std::string> words = {{{listed}}};\n"
        "    for (const auto& w : words) std::cout << w << '\\n';\n    return 0;\n}\n"
    )
    build = "#!/bin/bash\nset -e\ng++ -std=c++17 -o app main.cpp\n"
    return Made(
        values=",".join(words),
        prompt="`bash build.sh` fails to compile main.cpp. Fix main.cpp so the build succeeds "
        "and leaves the program `app` in the working directory.",
        files={"main.cpp": code, "build.sh": build},
        checks=(
            Check(
                name="builds",
                message="bash build.sh does not succeed",
                probe=succeeds("bash build.sh >/dev/null 2>&1"),
            ),
            Check(
                name="runs",
                message="./app does not print the words",
                probe=output_is("bash build.sh >/dev/null 2>&1 && ./app", "\n".join(words)),
            ),
        ),
        solution=("sed -i '1i #include <string>\\n#include <vector>' main.cpp", "bash build.sh"),
    )


def cpp_wrong_result(rng: random.Random) -> Made:
    values = [rng.randint(-20, 60) for _ in range(rng.randint(5, 9))]
    listed = ", ".join(map(str, values))
    code = (
        "#include <iostream>\n#include <vector>\n\nint main() {\n"
        f"    std::vector<int> v = {{{listed}}};\n"
        "    int best = 0;  // the largest value\n"
        "    for (int x : v) if (x < best) best = x;\n"
        "    std::cout << best << std::endl;\n    return 0;\n}\n"
    )
    return Made(
        values=listed,
        prompt="max.cpp should print the largest value of its vector but prints something "
        "else. Fix max.cpp; it is built with `g++ -o max max.cpp`.",
        files={"max.cpp": code},
        checks=only(
            name="max",
            message=f"max.cpp does not print {max(values)}",
            probe=output_is("g++ -o max max.cpp && ./max", str(max(values))),
        ),
        solution=("sed -i 's/int best = 0;/int best = v[0];/; s/x < best/x > best/' max.cpp",),
    )


def js_bug(rng: random.Random) -> Made:
    prices = [rng.randint(1, 90) for _ in range(rng.randint(3, 7))]
    rate = rng.choice((10, 20, 25, 40))
    total = sum(prices) * (100 - rate) // 100
    code = (
        f"const prices = [{', '.join(map(str, prices))}];\n"
        f"const discount = {rate};  // percent off the total\n"
        "let total = 0;\nfor (const p of prices) total += p;\n"
        "console.log(Math.floor(total * discount / 100));\n"
    )
    return Made(
        values=f"{prices}:{rate}",
        prompt=f"cart.js should print the cart's total after a {rate}% discount, rounded down, "
        "but prints the wrong amount. Fix it (run it with `node cart.js`).",
        files={"cart.js": code},
        checks=only(
            name="total",
            message=f"node cart.js does not print {total}",
            probe=output_is("node cart.js", str(total)),
        ),
        solution=("sed -i 's|total \\* discount / 100|total * (100 - discount) / 100|' cart.js",),
    )


def shell_variable(rng: random.Random) -> Made:
    target = rng.choice(NAMES)
    script = (
        "#!/bin/bash\n"
        f"TARGET={target}\n"
        'mkdir -p "out/$TARGT"\n'
        'echo "built $TARGET" > "out/$TARGET/status"\n'
    )
    return Made(
        values=target,
        prompt="deploy.sh fails when run with `bash deploy.sh`. Fix the script and run it, "
        f"so out/{target}/status exists.",
        files={"deploy.sh": script},
        checks=only(
            name="status",
            message=f"out/{target}/status does not say 'built {target}'",
            probe=file_is(f"out/{target}/status", f"built {target}"),
        ),
        solution=("sed -i 's/\\$TARGT/$TARGET/' deploy.sh", "bash deploy.sh"),
    )


def python_import(rng: random.Random) -> Made:
    factor = rng.randint(2, 9)
    value = rng.randint(3, 40)
    files = {
        "app/__init__.py": "",
        "app/helpers.py": f"def scale(x):\n    return x * {factor}\n",
        "main.py": f"from app.utils import scale\n\nprint(scale({value}))\n",
    }
    return Made(
        values=f"{factor}:{value}",
        prompt="`python3 main.py` fails with an import error. Fix main.py (the function it "
        "needs exists in the app package) so it runs.",
        files=files,
        checks=only(
            name="runs",
            message=f"python3 main.py does not print {factor * value}",
            probe=output_is("python3 main.py", str(factor * value)),
        ),
        solution=("sed -i 's/app.utils/app.helpers/' main.py",),
    )


def failing_test(rng: random.Random) -> Made:
    sep = rng.choice(("-", "_", "."))
    words = rng.sample(NAMES, 3)
    module = "def slug(words):\n    return ''.join(w.lower() for w in words)\n"
    test = (
        "from textutil import slug\n\n"
        f"assert slug({[w.title() for w in words]!r}) == {sep.join(words)!r}\n"
        "print('ok')\n"
    )
    hidden = "from textutil import slug; print(slug(['A', 'Bc']))"
    given = f"from textutil import slug; print(slug({[w.title() for w in words]!r}))"
    return Made(
        values=f"{sep}:{words}",
        prompt="`python3 test_textutil.py` fails. Fix textutil.py (not the test) so it passes.",
        files={"textutil.py": module, "test_textutil.py": test},
        checks=(
            # The test's own case, run from a copy of ours: the candidate's test file (or
            # a textutil.py that prints "ok" and exits) proves nothing.
            Check(
                name="test",
                message="slug does not pass the case of test_textutil.py",
                probe=output_is(f"python3 -c {q(given)}", sep.join(words)),
            ),
            Check(
                name="general",
                message="slug is not fixed for other words",
                probe=output_is(f"python3 -c {q(hidden)}", f"a{sep}bc"),
            ),
        ),
        solution=(f"sed -i \"s/''.join/'{sep}'.join/\" textutil.py",),
    )


def missing_function(rng: random.Random) -> Made:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    files = {
        "geometry.py": "def area(w, h):\n    return w * h\n",
        "report.py": f"from geometry import area, perimeter\n\nprint(area({a}, {b}), "
        f"perimeter({a}, {b}))\n",
    }
    return Made(
        values=f"{a}x{b}",
        prompt="report.py imports perimeter from geometry.py, which does not define it yet. "
        "Add perimeter(w, h) (the rectangle's perimeter) to geometry.py so "
        "`python3 report.py` runs.",
        files=files,
        checks=only(
            name="report",
            message=f"python3 report.py does not print {a * b} {2 * (a + b)}",
            probe=output_is("python3 report.py", f"{a * b} {2 * (a + b)}"),
        ),
        solution=(
            "printf '\\n\\ndef perimeter(w, h):\\n    return 2 * (w + h)\\n' >> geometry.py",
        ),
    )


TEMPLATES = {
    "python_off_by_one": python_off_by_one,
    "cpp_missing_include": cpp_missing_include,
    "cpp_wrong_result": cpp_wrong_result,
    "js_bug": js_bug,
    "shell_variable": shell_variable,
    "python_import": python_import,
    "failing_test": failing_test,
    "missing_function": missing_function,
}
