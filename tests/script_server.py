"""The tests' script launcher: imports TensorFlow once, then forks a child per script run (conftest.start_script).

A script run as `python onu_train.py ...` spends about 3.5 s of a test's time loading TensorFlow and its
libraries before its first line of work. This server loads them once per test process; each request forks it,
and the child becomes the script: its argv, environment, working folder and standard streams are the request's,
and it runs the script as `__main__`, exits as the script exits (atexit handlers included), and its exit status
is the script's. So a test still sees the script's own output and exit status, and can signal it by its pid.

Only what is the same in every fresh process is loaded before the fork: third-party libraries, imported as a
script imports them (onu_cli's quiet start, Keras's optional imports kept out). No onu module is imported here,
so a script's own start (its flags, onu_cli's reading of argv and the environment) runs in the child as in a
fresh process. No TensorFlow session runs here either: its thread pools would not survive the fork.

Protocol, one connection a run (a Unix socket): the client sends a JSON line {argv, env, cwd, new_session} with
its three standard file descriptors attached; the server answers a JSON line {"pid": N} once forked, then
{"returncode": N} once the child has exited (-N for signal N, as Popen says).
"""
import faulthandler
import json
import os
import runpy
import selectors
import signal
import socket
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the scripts import before their work starts, apart from the onu modules (measured: ~95% of a start).
PRELOADED = ('tensorflow', 'tf_slim', 'tf_keras.src.legacy_tf_layers.normalization', 'numpy', 'PIL.Image', 'cv2',
             'matplotlib.font_manager', 'tqdm', 'google_crc32c', 'ai_edge_litert.interpreter',
             'tensorboard.plugins.hparams.summary', 'tensorboard.plugins.hparams.summary_v2',
             'tensorboard.plugins.pr_curve.summary', 'absl.app', 'absl.flags', 'absl.logging')


def preload():
    """Imports TensorFlow as a script's quiet start does, then the other libraries the scripts use."""
    sys.path.insert(0, REPO_ROOT)
    from onu_lib import onu_cli  # pylint: disable=import-outside-toplevel
    with onu_cli.native_lines_dropped(onu_cli.NATIVE_START_UP_LINE), onu_cli.keras_optional_imports_skipped():
        __import__('tensorflow')
    for name in PRELOADED:
        __import__(name)
    for name in [name for name in sys.modules if name == 'onu_lib' or name.startswith(('onu_', 'onu_lib.'))]:
        del sys.modules[name]  # the child imports them afresh, as a script does
    sys.path.remove(REPO_ROOT)


def receive_request(connection):
    """Returns the request read from connection and the three file descriptors sent with it."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while not data.endswith(b'\n'):
        more = connection.recv(1 << 20)
        if not more:
            raise EOFError('request cut short')
        data += more
    return json.loads(data), fds


def become_the_script(request, fds):
    """In the forked child: takes the request's streams, argv, environment and folder, then runs the script."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if request['new_session']:
        os.setsid()
    sys.stdin = open(0, closefd=False)  # pylint: disable=consider-using-with
    sys.stdout = open(1, 'w', closefd=False)  # pylint: disable=consider-using-with
    sys.stderr = open(2, 'w', closefd=False)  # pylint: disable=consider-using-with
    os.environ.clear()
    os.environ.update(request['env'])
    os.chdir(request['cwd'])
    for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get('PYTHONFAULTHANDLER'):
        faulthandler.enable()
    if request['argv'][1] == '-m':  # python -m MODULE ARGS: the current folder first on the path, as Python puts it
        sys.argv = request['argv'][2:]
        sys.path[0] = os.getcwd()
        runpy.run_module(request['argv'][2], run_name='__main__', alter_sys=True)
    else:  # python SCRIPT ARGS: the script's folder first on the path
        sys.argv = request['argv'][1:]
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
        runpy.run_path(sys.argv[0], run_name='__main__')
    raise SystemExit(0)  # out through serve(): the interpreter ends as a script's does


def serve(path):
    """Answers run requests on the Unix socket at path until the socket file is removed."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    print('ready', flush=True)
    while os.path.exists(path):
        for key, _ in selector.select(timeout=5):
            if key.data is None:
                connection, _ = listener.accept()
                request, fds = receive_request(connection)
                pid = os.fork()
                if pid == 0:
                    for fileobj in [key.fileobj for key in selector.get_map().values()] + [connection]:
                        os.close(fileobj if isinstance(fileobj, int) else fileobj.detach())
                    selector.close()
                    become_the_script(request, fds)
                for fd in fds:
                    os.close(fd)
                connection.sendall(json.dumps({'pid': pid}).encode() + b'\n')
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, connection))
            else:
                pid, connection = key.data
                selector.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    connection.sendall(json.dumps({'returncode': os.waitstatus_to_exitcode(status)}).encode() + b'\n')
                except OSError:
                    pass  # the client has gone
                connection.close()


if __name__ == '__main__':
    preload()
    serve(sys.argv[1])
