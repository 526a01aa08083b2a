"""``python3 <this directory>``: start the agent (or, with --zygote, a fresh zygote).

Run as a directory, this file is a top-level script and the package is not imported
yet: it is loaded here under a private name, not as ``agent``, so that a Python run's
``import agent`` still finds the task's own agent.py and never the sandbox's.
"""

import importlib.util
import os
import sys

PACKAGE = "_temper_sandbox_agent"

if __package__:
    from .main import main
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    assert _spec is not None and _spec.loader is not None
    _package = importlib.util.module_from_spec(_spec)
    sys.modules[PACKAGE] = _package
    _spec.loader.exec_module(_package)
    main = _package.main

sys.exit(main())
