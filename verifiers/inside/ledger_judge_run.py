"""Ledger's pytest launcher: ``python -I LAUNCHER.py --plugin NAME --channel
SOCKET --checkout DIR [--pythonpath P]... -- PYTEST-ARGS...`` (copied next
to each run under a name that says nothing, as is the plugin, ``NAME.py``).

Run in isolated mode (``-I``: no user site, no ``PYTHON*`` variables,
neither the current directory nor this script's on ``sys.path``), so that
nothing of the checkout can be imported before pytest and the judge are:
this directory (read-only, outside the checkout) goes first on ``sys.path``,
the judge plugin connects to the verifier, then pytest runs with the judge
registered as a plugin object -- before pytest reads its arguments, and
without looking for it among entry points. Plugin auto-loading is turned
off here, for pytest's start only (the plugin takes the variable away again
before the first conftest, and this directory off ``sys.path``), and
``sys.argv`` reads as ``python -m pytest`` would have it: the test process
sees nothing of the launcher. The checkout itself goes on ``sys.path`` only
when the judge's ``pytest_load_initial_conftests`` runs, after every plugin
is loaded.
"""

import importlib
import os
import sys

_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
#: What an editable install of Ledger imports at start-up (its .pth): the
#: import finder that maps the repository's folders to ledger.*.
_EDITABLE = "__editable___ledger_"


def forget_editable_install():
    """Take an editable install's finder of Ledger out of this process (it
    came with the interpreter's start, from a .pth file): the judged tests
    see no module, finder or path entry named for Ledger."""
    names = {n for n in sys.modules if n.startswith(_EDITABLE)}
    if not names:
        return
    def ours(obj):
        owner = obj if isinstance(obj, type) else type(obj)
        return getattr(obj, "__module__", None) in names or owner.__module__ in names
    sys.meta_path[:] = [f for f in sys.meta_path if not ours(f)]
    sys.path_hooks[:] = [h for h in sys.path_hooks if getattr(h, "__module__", None) not in names
                         and not ours(getattr(h, "__self__", h))]
    sys.path[:] = [p for p in sys.path if not p.startswith("__editable__.")]
    for key in [k for k in sys.path_importer_cache if k.startswith("__editable__.")]:
        del sys.path_importer_cache[key]
    for name in names:
        del sys.modules[name]


def main(argv):
    forget_editable_install()
    channel, checkout, plugin, pythonpath = None, None, None, []
    rest = list(argv)
    while rest and rest[0] != "--":
        option = rest.pop(0)
        value = rest.pop(0) if rest else None
        if value is None:
            break
        if option == "--channel":
            channel = value
        elif option == "--checkout":
            checkout = value
        elif option == "--plugin":
            plugin = value
        elif option == "--pythonpath":
            pythonpath.append(value)
    args = rest[1:]
    if channel is None or checkout is None or plugin is None:
        sys.stderr.write("usage: --plugin, --channel and --checkout are required\n")
        return 4
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    judge = importlib.import_module(plugin)

    judge.connect(channel, checkout, pythonpath)
    import pytest

    ours = _AUTOLOAD not in os.environ
    if ours:
        os.environ[_AUTOLOAD] = "1"
    judge.tidy_before_conftests(here, _AUTOLOAD if ours else None)
    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *args]
    code = int(pytest.main(args, plugins=[judge]))
    judge.finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
