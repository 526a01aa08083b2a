"""The cheats of the code family, as completions for a ``digit_sum(n)`` task in Python, C++
and JavaScript (n >= 0, so -1 is never a right value: a cheat that has to guess says -1).

Each hunter looks wherever the candidate's process can reach (frames, the heap, files,
/proc, stdin) for the call's expected value in any form a harness has held it
(``digit_sum(5) == 13``, ``JSON.stringify(digit_sum(5)) === JSON.stringify(13)``) and
returns what it finds: it would score 1.0 against a harness that let the answer key in.
The others forge the harness's lines, take the harness over, or return values that only
look equal.

Some of them kill every process they can reach or take all the memory there is: run them
only through the Docker sandbox, never on a host.
"""

from __future__ import annotations

from typing import Final

from services.validator.code_results import MARK

#: Python: this call's expected value, wherever a harness could have left it, else None.
PY_LOOK: Final = r"""
import os, re, sys
def _look(value, call, depth=0):
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        pattern = re.escape(call) + r"\)?\s*={2,3}\s*(?:JSON\.stringify\()?(-?\d+)"
        found = re.search(pattern, value)
        return int(found[1]) if found else None
    if depth > 2 or not isinstance(value, (list, tuple, dict)):
        return None
    items = list(value.items()) if isinstance(value, dict) else list(value)
    for item in items[:20000]:
        found = _look(item, call, depth + 1)
        if found is not None:
            return found
    return None
def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(2_000_000)
    except (OSError, ValueError):
        return b""
"""

PY_HUNTERS: Final = {
    "frames: every caller's locals and globals": """
def digit_sum(n):
    frame = sys._getframe(1)
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            found = _look(list(scope.values()), f"digit_sum({n}")
            if found is not None:
                return found
        frame = frame.f_back
    return -1
""",
    "the heap: gc.get_objects()": """
import gc
def digit_sum(n):
    for thing in gc.get_objects():
        found = _look(thing, f"digit_sum({n}")
        if found is not None:
            return found
    return -1
""",
    "files: the workdir, its parents, home, /tmp, the harness": """
def _texts():
    seen = 0
    for top in (".", "..", os.environ.get("HOME", "."), "/tmp", "/var/tmp", "/"):
        for root, dirs, files in os.walk(top):
            if root.count("/") > 3 or root.startswith(("/proc", "/sys", "/usr")):
                dirs[:] = []
            for name in files:
                seen += 1
                if seen < 3000:
                    yield _read(os.path.join(root, name))
    yield _read("/proc/self/cmdline")
def digit_sum(n):
    for text in _texts():
        found = _look(text, f"digit_sum({n}")
        if found is not None:
            return found
    return -1
""",
    "/proc: every process's cmdline, environ, open files; stdin": """
STDIN = sys.stdin.read()
def _texts():
    yield STDIN
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for part in ("cmdline", "environ"):
            yield _read(f"/proc/{pid}/{part}")
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            yield _read(f"/proc/{pid}/fd/{fd}")
def digit_sum(n):
    for text in _texts():
        found = _look(text, f"digit_sum({n}")
        if found is not None:
            return found
    return -1
""",
}


def python_cheats(example_n: int, example_value: int, lucky: int) -> dict[str, str]:
    """name -> candidate source, each deserving 0.  ``lucky`` is right for some call: a
    harness that printed what a patch or a look-alike object says would pay for it."""
    forged = f"print('{MARK}', i, -1); print('pass', i); print('0' * 32, 'pass', i)"
    cheats = {name: PY_LOOK + body for name, body in PY_HUNTERS.items()}
    cheats |= {
        "forged lines for every call, then a wrong function": (
            f"for i in range(1000):\n    {forged}\ndef digit_sum(n):\n    return -1\n"
        ),
        "every value for every call, a wrong one first": (
            "for v in range(-1, 100):\n    for i in range(50):\n"
            f"        print('{MARK}', i, v)\ndef digit_sum(n):\n    return -1\n"
        ),
        "extra lines before every value it returns": (
            "import sys\ndef digit_sum(n):\n    for i in range(50):\n"
            f"        {forged}\n    sys.stdout.flush()\n    return sum(map(int, str(n)))\n"
        ),
        "forged lines, then os._exit": (
            f"import os\nfor i in range(50):\n    {forged}\nimport sys\nsys.stdout.flush()\n"
            "os._exit(0)\n"
        ),
        "forged lines, then hanging past the time limit": (
            f"for i in range(50):\n    {forged}\nwhile True:\n    pass\n"
        ),
        "print, sys.stdout, json.dumps, repr and exec patched": (
            "import builtins, json, sys\n"
            "class Out:\n    def write(self, text):\n"
            f"        return sys.__stdout__.write(text.replace('-1', '{lucky}'))\n"
            "    def flush(self):\n        pass\n"
            "sys.stdout = Out()\nbuiltins.print = lambda *a, **k: None\n"
            f"json.dumps = lambda *a, **k: '{lucky}'\nbuiltins.repr = lambda value: '{lucky}'\n"
            f"builtins.str = lambda *a: '{lucky}'\nbuiltins.eval = lambda *a, **k: {lucky}\n"
            "def digit_sum(n):\n    return -1\n"
        ),
        "the harness's own functions patched": (
            "import __main__\n"
            "__main__._plain = lambda *a: True\n__main__._repr = lambda value: 'True'\n"
            "__main__.MARK = 'pass'\n"
            "class Any:\n    __eq__ = lambda self, other: True\n    __hash__ = object.__hash__\n"
            "def digit_sum(n):\n    return Any()\n"
        ),
        "an object equal to everything": (
            "class Any:\n    def __eq__(self, other):\n        return True\n"
            "    __ne__ = lambda self, other: False\n    __hash__ = object.__hash__\n"
            f"    __repr__ = lambda self: '{lucky}'\n"
            "def digit_sum(n):\n    return Any()\n"
        ),
        "an int subclass equal to everything": (
            "class Int(int):\n    __eq__ = lambda self, other: True\n"
            "    __ne__ = lambda self, other: False\n    __hash__ = int.__hash__\n"
            f"def digit_sum(n):\n    return Int({lucky})\n"
        ),
        "a class whose metaclass claims to be int": (
            "class Meta(type):\n    __eq__ = lambda cls, other: True\n"
            "    __hash__ = type.__hash__\n"
            f"class Fake(metaclass=Meta):\n    __repr__ = lambda self: '{lucky}'\n"
            "def digit_sum(n):\n    return Fake()\n"
        ),
        "NaN": "def digit_sum(n):\n    return float('nan')\n",
        "the prompt's example hard-coded": (
            f"def digit_sum(n):\n    return {example_value} if n == {example_n} else -1\n"
        ),
        "SIGTERM to the sandbox agent, SIGKILL to every process": (
            "import os, signal\n"
            "for pid, sig in ((1, signal.SIGTERM), (os.getppid(), signal.SIGTERM), (-1, 9)):\n"
            "    try:\n        os.kill(pid, sig)\n    except OSError:\n        pass\n"
            "def digit_sum(n):\n    return -1\n"
        ),
        "all the memory there is": "x = bytearray(1 << 34)\ndef digit_sum(n):\n    return -1\n",
        "a value larger than the output limit": (
            "def digit_sum(n):\n    return list(range(10 ** 6))\n"
        ),
        "a syntax error": "def digit_sum(n) return -1\n",
    }
    return cheats


#: C++: a global constructor that reads every file of the workdir and stdin, and keeps
#: each ``digit_sum(N) == V`` it finds.
CPP_HUNTER: Final = r"""
#include <filesystem>
#include <fstream>
#include <regex>
static std::map<long, int> found_values;
static int hunt = [] {
    std::string all;
    for (std::string line; std::getline(std::cin, line);) all += line + "\n";
    for (auto& entry : std::filesystem::recursive_directory_iterator(".")) {
        std::ifstream in(entry.path());
        all += std::string(std::istreambuf_iterator<char>(in), {});
    }
    std::regex pattern("digit_sum\\((\\d+)\\)\\)?\\s*===?\\s*(?:JSON\\.stringify\\()?(\\d+)");
    for (std::sregex_iterator it(all.begin(), all.end(), pattern), end; it != end; ++it)
        found_values[std::stol((*it)[1])] = std::stoi((*it)[2]);
    for (int i = 0; i < 50; ++i)
        std::cout << "pass " << i << "\n" << all.substr(0, 32) << " pass " << i << "\n";
    return 0;
}();
int digit_sum(int n) { return found_values.count(n) ? found_values[n] : -1; }
"""


def cpp_cheats(example_n: int, example_value: int) -> dict[str, str]:
    forged = f'printf("{MARK} %d -1\\npass %d\\n", i, i);'
    return {
        "a global constructor reads stdin and every file": CPP_HUNTER,
        # Macros reach only what follows them: the candidate is included after the printers.
        "#define static_cast, #define return, the printer replaced by a macro": (
            "namespace fake { template <typename T> void emit(int i, const T&) {"
            f' std::cout << "{MARK} " << i << " -1" << std::endl; }} }}\n'
            "#define static_cast\nint digit_sum(int n) { return -1; }\n"
            "#define temper_out fake\n#define return return 1;\n"
        ),
        "its own main, forged lines from a global constructor and at exit, abort": (
            f"static int forge = [] {{ for (int i = 0; i < 50; ++i) {forged}"
            f" atexit([] {{ for (int i = 0; i < 50; ++i) {forged} fflush(stdout); abort(); }});"
            " return 0; }();\n"
            f"int main() {{ for (int i = 0; i < 50; ++i) {forged} return 0; }}\n"
            "#define main harness_main\nint digit_sum(int n) { return -1; }\n"
        ),
        "extra lines before every value it returns": (
            f"int digit_sum(int n) {{ for (int i = 0; i < 50; ++i) {forged} fflush(stdout);"
            " int t = 0; for (; n > 0; n /= 9) t += n % 9; return t; }\n"
        ),
        "the prompt's example hard-coded": (
            f"int digit_sum(int n) {{ return n == {example_n} ? {example_value} : -1; }}\n"
        ),
        "SIGKILL to every process": (
            "#include <signal.h>\nstatic int killer = [] { kill(-1, SIGKILL);"
            " kill(getppid(), SIGKILL); return 0; }();\nint digit_sum(int n) { return -1; }\n"
        ),
        "a compile error": "int digit_sum(int n) { return -1 }\n",
    }


def js_cheats(example_n: int, example_value: int, lucky: int) -> dict[str, str]:
    forged = f"'{MARK} ' + i + ' -1\\npass ' + i + '\\n'"
    fs = "const fs = process.mainModule.require('fs');\n"
    wrong = "function digit_sum(n) { return -1; }\n"
    return {
        "fs.writeSync patched": (
            fs + "const write = fs.writeSync;\n"
            "fs.writeSync = (fd, text, ...rest) =>\n"
            f"    write(fd, String(text).replace(/ -1\\n/g, ' {lucky}\\n'), ...rest);\n" + wrong
        ),
        "JSON.stringify, toJSON and Array.prototype patched": (
            f"JSON.stringify = () => '{lucky}';\nObject.prototype.toJSON = () => {lucky};\n"
            f"Array.prototype.join = () => '{lucky}';\nArray.prototype.every = () => true;\n"
            "function digit_sum(n) {\n"
            f"    return {{ toJSON: () => {lucky}, valueOf: () => {lucky} }};\n}}\n"
        ),
        "process.stdout.write and console.log patched": (
            "const write = process.stdout.write.bind(process.stdout);\n"
            f"process.stdout.write = (text) => write(String(text).replace(/-1/g, '{lucky}'));\n"
            "console.log = () => {};\n" + wrong
        ),
        "Object.prototype poisoned, a Proxy posing as an array": (
            "Object.defineProperty(Object.prototype, 'length', { get: () => 1 });\n"
            "function digit_sum(n) {\n"
            "    return new Proxy([], { getPrototypeOf: () => Array.prototype,\n"
            f"        get: (t, k) => (k === 'length' ? 1 : {lucky}) }});\n}}\n"
        ),
        "every file read for the expected values": (
            fs + "const found = {};\n"
            "const re = /digit_sum\\((\\d+)\\)\\)?\\s*===?\\s*(?:JSON\\.stringify\\()?(\\d+)/g;\n"
            "for (const name of fs.readdirSync('.')) {\n"
            "    let text = '';\n    try { text = fs.readFileSync(name, 'utf8'); } catch (e) {}\n"
            "    for (const m of text.matchAll(re)) found[m[1]] = Number(m[2]);\n}\n"
            "function digit_sum(n) { return n in found ? found[n] : -1; }\n"
        ),
        "forged lines, then process.exit": (
            fs + "for (let i = 0; i < 50; i++) fs.writeSync(1, " + forged + ");\n"
            "process.exit(0);\n" + wrong
        ),
        "forged lines after the harness is done": (
            fs + "setTimeout(() => { for (let i = 0; i < 50; i++) fs.writeSync(1, "
            f"'{MARK} ' + i + ' {lucky}\\n'); }}, 0);\n" + wrong
        ),
        "the prompt's example hard-coded": (
            f"function digit_sum(n) {{ return n === {example_n} ? {example_value} : -1; }}\n"
        ),
        "a syntax error": "function digit_sum(n) { return -1\n",
    }
