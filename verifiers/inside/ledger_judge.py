"""Ledger's judge plugin: runs inside the test process, before any of the
candidate's code, and tells the verifier what happened on a channel of its own.

Loaded by ``ledger_judge_run.py`` (the launcher; both copied under names
that say nothing) from a read-only directory outside the checkout, and registered with pytest as a plugin object before
pytest parses its arguments. At import -- before pytest has imported a
single conftest or test module -- it

* connects to the verifier's Unix socket (the verifier accepts exactly one
  connection and removes the socket: nothing started later can connect),
* keeps its own references to what it writes with (``os.write``, the clock)
  and to the pytest and pluggy internals a verdict depends on (the runner,
  the report class, the hook machinery), to check at the end that they are
  still the same objects.

It streams one JSON line per event, numbered: ``hello``, the collected test
ids, collection errors, one record per test (each phase's raw outcome, seen
by the outermost ``pytest_runtest_makereport`` wrapper from the call itself,
next to the outcome of the final report), and ``finish`` with the exit status
and what the integrity check found. The verifier treats a missing, partial or
inconsistent stream as a failure whatever the exit code.

Code running in this process (the candidate's) could still, in principle,
find the socket and write to it, or rewrite this module's memory: the
docs/running/judging.md ("What a candidate is judged by") says what holds and what does not.
Standard library and pytest only: nothing of Ledger's is importable here.
"""

import os
import socket
import sys
import time

import _pytest
import _pytest.config
import _pytest.main
import _pytest.outcomes
import _pytest.python
import _pytest.reports
import _pytest.runner
import _pytest.skipping
import pluggy
import pluggy._callers
import pluggy._hooks
import pluggy._manager
import pytest

VERSION = 1
_write = os.write
_clock = time.perf_counter
_getpid = os.getpid
_settrace_now = sys.gettrace
_profile_now = sys.getprofile
_Skipped = _pytest.outcomes.Skipped
_XFailed = _pytest.outcomes.XFailed

_state = {"fd": None, "seq": 0, "broken": None, "checkout": None, "pythonpath": (),
          "allowed_roots": (), "snapshot": None, "meta_path": None, "path_hooks": None,
          "tests": {}, "functions": {}, "collected": 0, "problems": [], "tidy": None}


# --- what must not change ------------------------------------------------------------------

def _module_attr(module, name):
    def get():
        mod = sys.modules.get(module)
        return None if mod is None else mod.__dict__.get(name)
    return get


def _class_attr(module, cls, name):
    def get():
        mod = sys.modules.get(module)
        owner = None if mod is None else mod.__dict__.get(cls)
        return None if owner is None else owner.__dict__.get(name)
    return get


def _module(name):
    return lambda: sys.modules.get(name)


_WATCHED = {
    "_pytest.runner module": _module("_pytest.runner"),
    "_pytest.reports module": _module("_pytest.reports"),
    "_pytest.python module": _module("_pytest.python"),
    "_pytest.main module": _module("_pytest.main"),
    "_pytest.skipping module": _module("_pytest.skipping"),
    "pluggy._callers module": _module("pluggy._callers"),
    "the judge's module": _module(__name__),
    "os._exit": _module_attr("os", "_exit"),
    "os.write": _module_attr("os", "write"),
}
for _name in ("runtestprotocol", "call_and_report", "call_runtest_hook", "check_interactive_exception",
              "pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call",
              "pytest_runtest_teardown", "pytest_runtest_makereport", "CallInfo", "SetupState",
              "get_reraise_exceptions"):
    _WATCHED[f"_pytest.runner.{_name}"] = _module_attr("_pytest.runner", _name)
for _name in ("from_call", "__init__", "excinfo", "result"):
    _WATCHED[f"CallInfo.{_name}"] = _class_attr("_pytest.runner", "CallInfo", _name)
for _name in ("setup", "teardown_exact"):
    _WATCHED[f"SetupState.{_name}"] = _class_attr("_pytest.runner", "SetupState", _name)
for _name in ("TestReport", "CollectReport", "BaseReport"):
    _WATCHED[f"_pytest.reports.{_name}"] = _module_attr("_pytest.reports", _name)
for _name in ("from_item_and_call", "__init__"):
    _WATCHED[f"TestReport.{_name}"] = _class_attr("_pytest.reports", "TestReport", _name)
for _name in ("passed", "failed", "skipped"):
    _WATCHED[f"BaseReport.{_name}"] = _class_attr("_pytest.reports", "BaseReport", _name)
for _name in ("Function", "pytest_pyfunc_call"):
    _WATCHED[f"_pytest.python.{_name}"] = _module_attr("_pytest.python", _name)
for _name in ("runtest", "setup", "_getobj", "function"):
    _WATCHED[f"Function.{_name}"] = _class_attr("_pytest.python", "Function", _name)
for _name in ("pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_makereport",
              "evaluate_xfail_marks", "evaluate_skip_marks"):
    _WATCHED[f"_pytest.skipping.{_name}"] = _module_attr("_pytest.skipping", _name)
for _name in ("pytest_runtestloop", "pytest_collection", "Session"):
    _WATCHED[f"_pytest.main.{_name}"] = _module_attr("_pytest.main", _name)
for _name in ("perform_collect", "genitems"):
    _WATCHED[f"Session.{_name}"] = _class_attr("_pytest.main", "Session", _name)
_WATCHED["pluggy._callers._multicall"] = _module_attr("pluggy._callers", "_multicall")
for _name in ("__call__", "call_historic", "call_extra", "_hookexec", "get_hookimpls"):
    _WATCHED[f"HookCaller.{_name}"] = _class_attr("pluggy._hooks", "HookCaller", _name)
for _name in ("_hookexec", "register", "subset_hook_caller"):
    _WATCHED[f"PluginManager.{_name}"] = _class_attr("pluggy._manager", "PluginManager", _name)

#: (name, getter, the object it gave at import)
_SAVED = [(name, get, get()) for name, get in _WATCHED.items()]
_OWN_HOOKS = {}  # filled at the end of the module: our hook functions, by name


def _changed():
    """What of the watched objects is no longer what it was at import."""
    found = [name for name, get, was in _SAVED if get() is not was]
    module = sys.modules.get(__name__)
    for name, function in _OWN_HOOKS.items():
        if module is None or module.__dict__.get(name) is not function:
            found.append(f"the judge's {name}")
    return found


# --- the channel -----------------------------------------------------------------------------

def _text(value):
    """JSON for str, int, float, bool, None, list and dict, written here so that
    nothing the candidate can patch (the json module's encoder) encodes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        return float.__repr__(value) if value == value and value not in (float("inf"), float("-inf")) \
            else "null"
    if kind is str:
        out = ['"']
        for ch in value:
            code = ord(ch)
            if ch == '"':
                out.append('\\"')
            elif ch == "\\":
                out.append("\\\\")
            elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
                out.append("\\u%04x" % code)
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    if kind in (list, tuple):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if kind is dict:
        return "{" + ",".join(_text(str(k)) + ":" + _text(v) for k, v in value.items()) + "}"
    return _text(str(value))


def _send(event, **fields):
    fd = _state["fd"]
    if fd is None or _state["broken"]:
        return
    record = {"seq": _state["seq"], "event": event, **fields}
    _state["seq"] += 1
    data = (_text(record) + "\n").encode("utf-8", "surrogatepass")
    try:
        while data:
            written = _write(fd, data)
            data = data[written:]
    except OSError as exc:
        _state["broken"] = f"the channel broke: {exc}"


def connect(path, checkout, pythonpath):
    """Connect to the verifier (before anything of the candidate's is imported)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    _state["fd"] = sock.detach()
    _state["checkout"] = os.path.realpath(checkout)
    _state["pythonpath"] = tuple(pythonpath)
    _state["allowed_roots"] = _roots([__file__, _pytest.__file__, pluggy.__file__, pytest.__file__],
                                     [sys.prefix, sys.base_prefix, sys.exec_prefix])
    _send("hello", judge=VERSION, pid=_getpid(), python=sys.version.split()[0],
          pytest=pytest.__version__, watched=len(_SAVED))


def tidy_before_conftests(directory, variable):
    """What the launcher set up for pytest's start and the tests must not
    see: its directory on ``sys.path``, the variable that turned plugin
    auto-loading off (``None``: the class set it, it stays)."""
    _state["tidy"] = (directory, variable)


def _tidy():
    tidy = _state["tidy"]
    if tidy is None:
        return
    directory, variable = tidy
    while directory in sys.path:
        sys.path.remove(directory)
    if variable is not None:
        os.environ.pop(variable, None)


def finish(exit_code):
    """The last record: the exit status pytest returned and the integrity check."""
    problems = list(_state["problems"])
    changed = _changed()
    if changed:
        problems.append("changed since the judge started: " + ", ".join(changed[:20]))
    _send("finish", exit=int(exit_code), problems=problems[:50], tests=len(_state["tests"]),
          collected=_state["collected"])
    fd = _state["fd"]
    _state["fd"] = None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


# --- hooks -----------------------------------------------------------------------------------

def _roots(files, directories):
    """Where trusted code lives: the directories of ``files`` and ``directories``
    themselves (the interpreter's prefixes), never the checkout or above it."""
    checkout = _state["checkout"] or "/nonexistent"
    found = list(_state["allowed_roots"])
    for where in [os.path.dirname(os.path.realpath(f)) for f in files if f] + \
            [os.path.realpath(d) for d in directories if d]:
        if where in found or where in ("/", "") or checkout == where or \
                checkout.startswith(where.rstrip(os.sep) + os.sep) or where.startswith(checkout + os.sep):
            continue
        found.append(where)
    return tuple(found)


def _allowed(function):
    """Whether a hook implementation's code lives in pytest, pluggy, this judge,
    a plugin the class declared, or a conftest.py of the checkout (which the
    verifier restored from the base)."""
    inner = getattr(function, "__func__", function)
    code = getattr(inner, "__code__", None)
    if code is None:
        return False
    where = os.path.realpath(code.co_filename)
    if any(where == root or where.startswith(root + os.sep) for root in _state["allowed_roots"]):
        return True
    checkout = _state["checkout"]
    return (checkout is not None and os.path.basename(where) == "conftest.py"
            and where.startswith(checkout + os.sep))


def _check_hooks(config):
    found = []
    manager = config.pluginmanager
    if manager.get_plugin(__name__) is not sys.modules.get(__name__):
        found.append("the judge plugin is no longer registered")
    if getattr(manager, "_inner_hookexec", None) is not _WATCHED["pluggy._callers._multicall"]():
        found.append("the hook caller was replaced (pluggy's _inner_hookexec)")
    for name, caller in vars(config.hook).items():
        if not name.startswith("pytest_"):
            continue
        if getattr(getattr(caller, "_hookexec", None), "__func__", None) is not \
                _WATCHED["PluginManager._hookexec"]():
            found.append(f"hook {name} calls through something else")
        for impl in caller.get_hookimpls():
            if not _allowed(impl.function):
                where = getattr(getattr(impl.function, "__code__", None), "co_filename", "?")
                found.append(f"hook {name} implemented outside pytest, the judge and the declared "
                             f"plugins ({where})")
    for name, function in _OWN_HOOKS.items():
        impls = getattr(config.hook, name).get_hookimpls()
        if not any(impl.function is function for impl in impls):
            found.append(f"the judge's {name} is no longer called")
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config):
    """Before the first conftest: put the checkout on sys.path -- after the
    standard library, before site-packages -- and note what the import system
    looks like now (plugins are all imported by here, from the interpreter's
    own site-packages, never from the checkout)."""
    checkout = _state["checkout"] or os.getcwd()
    entries = [os.path.normpath(os.path.join(checkout, p)) for p in _state["pythonpath"] or (".",)]
    at = next((i for i, p in enumerate(sys.path) if p.rstrip("/").endswith(("site-packages", "dist-packages"))),
              len(sys.path))
    sys.path[at:at] = [e for e in entries if e not in sys.path]
    # The plugins loaded so far (pytest's own, the judge, those the class
    # declared) are trusted; so is where their code lives.
    files = []
    for plugin in early_config.pluginmanager.get_plugins():
        module = plugin if hasattr(plugin, "__file__") else sys.modules.get(type(plugin).__module__)
        files.append(getattr(module, "__file__", None))
    _state["allowed_roots"] = _roots(files, [])
    _state["meta_path"] = list(sys.meta_path)
    _state["path_hooks"] = list(sys.path_hooks)
    _tidy()  # plugins are loaded: nothing of the launcher's stays for the tests to see
    problems = _changed()
    if problems:
        _state["problems"].append("changed before collection: " + ", ".join(problems[:20]))


def _raw(call):
    excinfo = call.excinfo
    if excinfo is None:
        return "passed"
    if isinstance(excinfo.value, (_Skipped, _XFailed)):
        return "skipped"
    return "failed"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    raw = _raw(call)
    report = yield
    record = _state["tests"].setdefault(item.nodeid, {"phases": {}, "started": None, "duration": 0.0})
    record["phases"][call.when] = [raw, None, False]
    return report


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    record = _state["tests"].get(report.nodeid)
    if record is None or report.when not in record["phases"]:
        _state["problems"].append(f"a report of {report.nodeid} ({report.when}) no call made")
        return
    phase = record["phases"][report.when]
    phase[1] = report.outcome
    phase[2] = bool(getattr(report, "wasxfail", None))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    record = _state["tests"].setdefault(item.nodeid, {"phases": {}, "started": None, "duration": 0.0})
    function = _state["functions"].get(item.nodeid)
    started = _clock()
    try:
        return (yield)
    finally:
        record["duration"] = _clock() - started
        now = _functions_of(item)
        if function is not None and now != function:
            _state["problems"].append(f"the test function of {item.nodeid} changed between "
                                      "collection and its run")
        phases = {when: {"raw": p[0], "outcome": p[1], "xfail": p[2]}
                  for when, p in record["phases"].items()}
        _send("test", id=item.nodeid, phases=phases, duration=round(record["duration"], 6))


def _functions_of(item):
    function = getattr(item, "function", None) if isinstance(item, pytest.Function) else None
    code = getattr(function, "__code__", None)
    return (id(function), id(code), getattr(code, "co_code", None))


@pytest.hookimpl(trylast=True)
def pytest_collectreport(report):
    if report.failed:
        _send("collect_error", id=report.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    ids = [item.nodeid for item in session.items]
    _state["collected"] = len(ids)
    for item in session.items:
        _state["functions"][item.nodeid] = _functions_of(item)
    for start in range(0, len(ids), 500):
        _send("collected", ids=ids[start:start + 500])
    _send("collection", count=len(ids))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    problems = _state["problems"]
    problems.extend(_check_hooks(session.config))
    # (before pytest's own clean-up takes its import hook away again)
    if _state["meta_path"] is not None and list(sys.meta_path) != _state["meta_path"]:
        problems.append("the import system changed (sys.meta_path)")
    if _state["path_hooks"] is not None and list(sys.path_hooks) != _state["path_hooks"]:
        problems.append("the import system changed (sys.path_hooks)")
    if _settrace_now() is not None or _profile_now() is not None:
        problems.append("a trace or profile function is installed")
    _send("session", exitstatus=int(exitstatus))


_OWN_HOOKS.update({name: globals()[name] for name in (
    "pytest_load_initial_conftests", "pytest_runtest_makereport", "pytest_runtest_logreport",
    "pytest_runtest_protocol", "pytest_collectreport", "pytest_collection_finish",
    "pytest_sessionfinish")})
