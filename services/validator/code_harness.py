"""What runs in the sandbox for the code validator: the candidate, its calls, and a
harness that prints what each call returned.  Nothing here knows an expected value.

The harness writes one line per call that returned a plain value::

    @@temper-value <index> <value>

``<value>`` is Python's ``repr`` (Python) or JSON (C++, JavaScript) of the returned value,
and only of plain data (numbers, strings, booleans, None/null, and lists, tuples, sets
and dicts of them, exact types only): an object of the candidate's own class, a subclass
of a builtin or NaN prints nothing and that call fails.  The validator reads the lines in
its own process and compares them with the expected values, which never enter the
sandbox.  The candidate may print lines of the same form; it would have to compute the
values they hold, which is the task.
"""

from __future__ import annotations

import ast
import json
from typing import Final

#: The prefix of a harness line.
MARK: Final = "@@temper-value"

PYTHON: Final = f"""\
import json, sys
MARK = {MARK!r}
_write, _flush, _repr, _type = sys.stdout.write, sys.stdout.flush, repr, type
_PLAIN = (int, float, str, bool, bytes, type(None))
_SEQUENCES = (list, tuple, set, frozenset)


def _plain(value, depth=0):
    kind = _type(value)
    if depth > 64:
        return False
    if kind in _PLAIN:
        return kind is not float or value == value
    if kind in _SEQUENCES:
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


calls = json.load(open("calls.json"))
namespace = {{"__name__": "solution"}}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
except BaseException as error:
    print("load:", _type(error).__name__, error, file=sys.stderr)
    sys.exit(0)
for index, call in enumerate(calls):
    try:
        value = eval(call, dict(namespace))
        if _plain(value):
            _write(MARK + " " + str(index) + " " + _repr(value) + "\\n")
            _flush()
    except BaseException as error:
        print("call", index, _type(error).__name__, file=sys.stderr)
"""

JS: Final = f"""\
const fs = require('fs');
const vm = require('vm');
const MARK = {json.dumps(MARK)};
const writeSync = fs.writeSync, stringify = JSON.stringify, isArray = Array.isArray;
const getPrototypeOf = Object.getPrototypeOf, values = Object.values;
const objectPrototype = Object.prototype, isFinite = Number.isFinite;
const plain = (value, depth) => {{
    if (depth > 64) return false;
    if (value === null || typeof value === 'string' || typeof value === 'boolean') return true;
    if (typeof value === 'number') return isFinite(value);
    if (isArray(value)) return value.every((item) => plain(item, depth + 1));
    if (typeof value === 'object' && getPrototypeOf(value) === objectPrototype) {{
        return values(value).every((item) => plain(item, depth + 1));
    }}
    return false;
}};
const calls = JSON.parse(fs.readFileSync('calls.json', 'utf8'));
try {{
    vm.runInThisContext(fs.readFileSync('solution.js', 'utf8'), {{ filename: 'solution.js' }});
}} catch (error) {{
    console.error('load: ' + String(error));
    process.exit(0);
}}
calls.forEach((call, index) => {{
    try {{
        const value = vm.runInThisContext(call);
        if (plain(value, 0)) writeSync(1, MARK + ' ' + index + ' ' + stringify(value) + '\\n');
    }} catch (error) {{
        console.error('call ' + index + ' ' + String(error));
    }}
}});
"""

CPP_HEAD: Final = """\
#include <bits/stdc++.h>
using namespace std;
namespace temper_out {
inline void put(std::ostream& out, bool value) { out << (value ? "true" : "false"); }
inline void put(std::ostream& out, int value) { out << value; }
inline void put(std::ostream& out, long value) { out << value; }
inline void put(std::ostream& out, long long value) { out << value; }
inline void put(std::ostream& out, unsigned value) { out << value; }
inline void put(std::ostream& out, unsigned long value) { out << value; }
inline void put(std::ostream& out, unsigned long long value) { out << value; }
inline void put(std::ostream& out, double value) {
    if (!std::isfinite(value)) throw std::runtime_error("not finite");
    out << std::setprecision(17) << value;
}
inline void put(std::ostream& out, const std::string& value) {
    out << '"';
    for (unsigned char c : value) {
        if (c == '"' || c == '\\\\') out << '\\\\' << c;
        else if (c < 0x20) out << "\\\\u" << std::hex << std::setw(4) << std::setfill('0')
                                << int(c) << std::dec << std::setfill(' ');
        else out << c;
    }
    out << '"';
}
template <typename T> void put(std::ostream& out, const std::vector<T>& items) {
    out << '[';
    for (size_t i = 0; i < items.size(); ++i) { if (i) out << ','; put(out, items[i]); }
    out << ']';
}
template <typename T> void emit(int index, const T& value) {
    std::ostringstream text;
    put(text, value);
    std::cout << "MARK " << index << ' ' << text.str() << std::endl;
}
}  // namespace temper_out
""".replace("MARK", MARK)
CPP_CALL: Final = (
    "    try {{ temper_out::emit({index}, {call}); }}"
    ' catch (...) {{ std::cerr << "call {index} threw" << std::endl; }}'
)


def cpp_main(calls: list[str]) -> str:
    """The harness's ``main.cc``: the candidate is included after the printers, so that a
    macro of its own cannot reach them; a macro can only spoil its own calls."""
    lines = "\n".join(CPP_CALL.format(index=i, call=call) for i, call in enumerate(calls))
    return f'{CPP_HEAD}#include "solution.cc"\nint main() {{\n{lines}\n    return 0;\n}}\n'


#: (command, code, files) of a run: exactly one of command and code is set.
Program = tuple[list[str] | None, str | None, dict[str, bytes]]


def program(language: str, candidate: str, calls: list[str]) -> Program:
    """What the sandbox runs for ``candidate`` in ``language``: the harness and the calls."""
    calls_json = json.dumps(calls).encode()
    if language == "python":
        return None, PYTHON, {"solution.py": candidate.encode(), "calls.json": calls_json}
    if language == "cpp":
        command = ["sh", "-c", "g++ -O2 -std=c++17 -o main main.cc && exec ./main"]
        files = {"solution.cc": candidate.encode(), "main.cc": cpp_main(calls).encode()}
        return command, None, files
    files = {"solution.js": candidate.encode(), "calls.json": calls_json, "main.js": JS.encode()}
    return ["node", "main.js"], None, files


def returned(stdout: str, total: int, language: str) -> dict[int, object]:
    """The value each call returned, by index: the first line for an index counts, and a
    line that does not parse counts as nothing."""
    found: dict[int, object] = {}
    for line in stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[0] != MARK or not parts[1].isdigit():
            continue
        index = int(parts[1])
        if index >= total or index in found:
            continue
        value = _parse(parts[2], language)
        if value is not _UNREADABLE:
            found[index] = value
    return found


_UNREADABLE: Final = object()


def _parse(text: str, language: str) -> object:
    try:
        if language == "python":
            return ast.literal_eval(text)
        return json.loads(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _UNREADABLE
