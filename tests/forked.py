"""Run by `conftest.run_forked` in a process forked from the tests' forkserver, which imported torch and distrib
once: `python ARGV...` as a new interpreter would run it, without importing torch again (about 1.7 s of CPU per
process). ARGV is `['-m', module, *args]` or `[script.py, *args]`, run as `__main__`; the process gets the
environment `ENV`, the working directory `CWD`, standard output to the file `OUT` and standard error to `ERR` (these
five globals are given by `runpy.run_path(init_globals=...)`). Processes the launcher starts are new interpreters,
as always."""
import atexit, os, runpy, signal, sys

for fd, path in ((1, OUT), (2, ERR)):  # noqa: F821 (given by run_path)
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(f, fd)
    os.close(f)
sys.stdout.reconfigure(line_buffering=True)
os.chdir(CWD)  # noqa: F821
os.environ.clear()
os.environ.update(ENV)  # noqa: F821
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter
signal.signal(signal.SIGTERM, signal.SIG_DFL)

try:
    if ARGV[0] == '-m':  # noqa: F821
        sys.argv = ARGV[1:]  # noqa: F821 (run_module puts the module's file first, as `python -m` does)
        sys.modules.pop(ARGV[1], None)  # noqa: F821 (imported by the server: run afresh, as `python -m` would)
        runpy.run_module(ARGV[1], run_name='__main__', alter_sys=True)  # noqa: F821
    else:
        sys.argv = list(ARGV)  # noqa: F821
        sys.path[0] = os.path.dirname(os.path.abspath(ARGV[0]))  # noqa: F821 (as `python script.py` sets it)
        runpy.run_path(ARGV[0], run_name='__main__')  # noqa: F821
finally:
    atexit._run_exitfuncs()  # what the interpreter's exit would run
    sys.stdout.flush()
    sys.stderr.flush()
