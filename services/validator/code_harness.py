"""What runs in the sandbox for the code validator: the candidate, its calls, and a
harness that prints what each call returned.  Nothing here knows an expected value.

The harness writes one line per call that returned plain data::

    @@temper-value <index> <value>

``<value>`` is Python's ``repr`` (Python) or JSON (C++, JavaScript) of the returned value,
and only of plain data, exact types only: numbers (finite), strings, booleans,
None/null, and lists, tuples, sets and dicts of them (Python), arrays and plain objects
(JavaScript), ``std::vector`` (C++).  An object of the candidate's own class, a subclass
of a builtin, NaN or an infinity prints nothing, and that call fails.  The validator
reads the lines in its own process (:mod:`services.validator.code_results`) and compares
them with the expected values, which never enter the sandbox.  The candidate may print
lines of the same form, or take the harness over: it would still have to compute the
values the lines hold, which is the task.
"""

from __future__ import annotations

import json
from typing import Final

from services.validator.code_results import MARK

# The harness runs as __main__; the candidate runs in a namespace of its own.  What the
# harness prints with is taken before the candidate loads, so that patching builtins,
# sys.stdout or print later does not change how a right value prints.
PYTHON: Final = f"""\
import json, sys
MARK = {MARK!r}
_write, _flush, _err = sys.stdout.write, sys.stdout.flush, sys.stderr.write
_repr, _type, _str, _eval, _dict, _float = repr, type, str, eval, dict, float
_ATOMS = (int, float, str, bool, bytes, type(None))
_SEQUENCES = (list, tuple, set, frozenset)


def _plain(value, depth):
    if depth > 64:
        return False
    kind = _type(value)
    for atom in _ATOMS:  # `is`, not `in`: a metaclass's __eq__ cannot pass for a type
        if kind is atom:
            return kind is not _float or value - value == 0  # finite
    for sequence in _SEQUENCES:
        if kind is sequence:
            for item in value:
                if not _plain(item, depth + 1):
                    return False
            return True
    if kind is dict:
        for key, item in value.items():
            if not (_plain(key, depth + 1) and _plain(item, depth + 1)):
                return False
        return True
    return False


calls = json.load(open("calls.json"))
namespace = {{"__name__": "solution"}}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
except BaseException as error:
    print("load:", _type(error).__name__, error, file=sys.stderr)
    sys.exit(0)
for index in range(len(calls)):
    try:
        value = _eval(calls[index], _dict(namespace))
        if _plain(value, 0):
            _write(MARK + " " + _str(index) + " " + _repr(value) + "\\n")
            _flush()
        else:
            _err("call " + _str(index) + ": not plain data\\n")
    except BaseException as error:
        try:
            _err("call " + _str(index) + ": " + _type(error).__name__ + "\\n")
        except BaseException:
            pass
"""

# JSON text is built here from primitives (JSON.stringify only on strings and numbers,
# which look up no toJSON), so that patching JSON, Object.prototype, Array.prototype or
# process.stdout after the harness starts does not change how a right value prints.
JS: Final = f"""\
'use strict';
const fs = require('fs');
const vm = require('vm');
const MARK = {json.dumps(MARK)};
const writeSync = fs.writeSync, stringify = JSON.stringify;
const isArray = Array.isArray, getPrototypeOf = Object.getPrototypeOf, keys = Object.keys;
const objectPrototype = Object.prototype, arrayPrototype = Array.prototype;
const isFinite = Number.isFinite, run = vm.runInThisContext, exit = process.exit;
const say = (text) => {{ try {{ writeSync(2, text + '\\n'); }} catch (e) {{}} }};
const json = (value, depth) => {{
    if (depth > 64) return undefined;
    if (value === null) return 'null';
    if (value === true) return 'true';
    if (value === false) return 'false';
    if (typeof value === 'string') return stringify(value);
    if (typeof value === 'number') return isFinite(value) ? stringify(value) : undefined;
    if (typeof value !== 'object') return undefined;
    const prototype = getPrototypeOf(value);
    let out = '';
    if (isArray(value) && prototype === arrayPrototype) {{
        for (let i = 0; i < value.length; i++) {{
            const part = json(value[i], depth + 1);
            if (part === undefined) return undefined;
            out += (i ? ',' : '') + part;
        }}
        return '[' + out + ']';
    }}
    if (prototype !== objectPrototype) return undefined;
    const names = keys(value);
    for (let i = 0; i < names.length; i++) {{
        const part = json(value[names[i]], depth + 1);
        if (part === undefined) return undefined;
        out += (i ? ',' : '') + stringify(names[i]) + ':' + part;
    }}
    return '{{' + out + '}}';
}};
const calls = JSON.parse(fs.readFileSync('calls.json', 'utf8'));
try {{
    run(fs.readFileSync('solution.js', 'utf8'), {{ filename: 'solution.js' }});
}} catch (error) {{
    try {{ say('load: ' + String(error)); }} catch (e) {{}}
    exit(0);
}}
for (let index = 0; index < calls.length; index++) {{
    try {{
        const value = json(run(calls[index]), 0);
        if (value === undefined) say('call ' + index + ': not plain data');
        else writeSync(1, MARK + ' ' + index + ' ' + value + '\\n');
    }} catch (error) {{
        say('call ' + index + ' threw');
    }}
}}
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
