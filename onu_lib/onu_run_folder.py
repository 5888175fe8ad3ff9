"""One process per run folder, and writes into it that fail.

    lock = hold_folder(train_dir, 'training', 'train_dir')   # FolderInUse if a live process holds it
    with stop_on_write_failure(train_dir, 'training', train_dir):   # a full disk: WriteFailed, one line
        ...

A lock left by a process that died is taken over, said in one line; a clean end empties the lock file, so the next
start says nothing. TensorFlow's event-writer thread, which would print a traceback of a failed write, is kept quiet.

A library module: explicit arguments only, no flags.
"""
import atexit
import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time

import tensorflow as tf

from onu_lib import onu_checkpoint
from onu_lib import onu_errors

LOCK_FILENAME = '.onu-lock'  # in a run folder: who uses it (pid, host, start time), while it does
# Why a write can fail that the user can fix, by errno and by the words TensorFlow's errors carry.
WRITE_FAILURES = {errno.ENOSPC: 'the disk is full', errno.EDQUOT: 'the disk quota is used up',
                  errno.EROFS: 'the file system is read-only', errno.EACCES: 'permission denied',
                  errno.EPERM: 'permission denied'}
WRITE_FAILURE_WORDS = {'No space left on device': 'the disk is full', 'Disk quota exceeded': 'the disk quota is used up',
                       'Read-only file system': 'the file system is read-only', 'Permission denied': 'permission denied'}


class FolderInUse(onu_errors.UserError):
    """Another live process uses the run folder; the message names it and what to do."""


class WriteFailed(Exception):
    """A run folder could not be written (full disk, read-only, no rights); the message is one line."""


def write_failure(error, folder=None):
    """Returns why a write failed ('the disk is full', ...), on a file in folder if given, or None if it did not."""
    if isinstance(error, OSError):
        reason = WRITE_FAILURES.get(error.errno)
        path = error.filename
    else:
        message = str(getattr(error, 'message', '') or error)
        reason = next((reason for words, reason in WRITE_FAILURE_WORDS.items() if words in message), None)
        path = message
    if reason is None or folder is None:
        return reason
    places = {folder, os.path.abspath(folder), os.path.realpath(folder)}
    return reason if path is not None and any(place in str(path) for place in places) else None


def write_failed(folder, reason, what, checkpoint_dir=None):
    """Returns the WriteFailed of a write into folder that failed for reason: what to do, and where to resume."""
    fix = ('free some space' if 'full' in reason or 'quota' in reason
           else f'make {folder} writable, or use another folder')
    resume = ''
    if checkpoint_dir is not None:
        newest, _ = onu_checkpoint.newest_readable(checkpoint_dir)
        resume = (f'; the newest complete checkpoint is {newest}: {fix}, then run the same command again to resume '
                  f'from it' if newest else f'; there is no complete checkpoint yet: {fix}, then run the same command '
                  f'again')
    return WriteFailed(f'{folder}: {reason} ({what}){resume or "; " + fix + ", then run the same command again"}')


def _what_failed(error, default):
    """What a failed write was writing, from the file its error names, else default."""
    message = str(getattr(error, 'message', '') or error)
    for words, what in ((onu_checkpoint.CHECKPOINT_BASENAME, 'saving a checkpoint'),
                        ('events.out.tfevents', 'writing an event file'), ('saved_model', 'exporting a SavedModel'),
                        ('run_config', 'writing run_config.json'), ('results.jsonl', 'writing results.jsonl')):
        if words in message:
            return what
    return default


@contextlib.contextmanager
def stop_on_write_failure(folder, what, checkpoint_dir=None):
    """Within it, a write that fails for lack of space or rights becomes WriteFailed: one line naming folder, the
    reason and (checkpoint_dir given) the newest complete checkpoint to resume from; other errors pass."""
    _quiet_writer_thread_failures()
    try:
        yield
    except (tf.errors.OpError, OSError) as error:
        reason = write_failure(error, folder)
        if reason is None:
            raise
        raise write_failed(folder, reason, _what_failed(error, what), checkpoint_dir) from None


class _WriterThreadFailure(logging.Filter):
    """Drops TensorFlow's log line of an event-writer thread that failed to write (the run then stops with one)."""

    def filter(self, record):
        return not (record.getMessage().startswith('EventFileWriter writer thread error') and
                    write_failure(Exception(record.getMessage())) is not None)


def _quiet_writer_thread_failures():
    """Keeps a write failure in TensorFlow's event-writer thread (logged, with a traceback) to the one line of
    WriteFailed that the next summary write gives in the main thread."""
    if getattr(threading.excepthook, 'onu_quiet', False):
        return
    previous = threading.excepthook

    def hook(args):
        if write_failure(args.exc_value) is None:
            previous(args)
    hook.onu_quiet = True
    threading.excepthook = hook
    tf.get_logger().addFilter(_WriterThreadFailure())


def _holder():
    """Who this process is, as a lock file says it: pid, host, start time and command."""
    return {'pid': os.getpid(), 'host': socket.gethostname(),
            'started': datetime.datetime.now().isoformat(timespec='seconds'),
            'command': os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'}


def _describe_holder(holder):
    """One phrase naming a lock's holder."""
    return (f'{holder.get("command", "a process")} (pid {holder.get("pid", "?")} on {holder.get("host", "?")}, '
            f'started {holder.get("started", "?")})')


def _read_holder(fd):
    """The holder a lock file names ({} when it is empty: released cleanly, or new)."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode('utf-8', errors='replace').strip()
    try:
        holder = json.loads(text) if text else {}
    except ValueError:
        holder = {'command': 'an unknown process'}
    return holder if isinstance(holder, dict) else {}


class FolderLock:
    """This process's hold on a run folder (flock on folder/.onu-lock: the kernel drops it when the process ends)."""

    def __init__(self, folder, fd):
        self.folder = folder
        self._fd = fd

    def release(self):
        """Empties the lock file (a clean end: nothing to take over) and lets it go."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass  # a full disk does not keep the folder locked: the kernel's lock ends with the file
        os.close(self._fd)
        self._fd = None


def hold_folder(folder, usage, flag, report=print):
    """Returns the FolderLock (released at exit) of folder for this process (usage: 'training', 'evaluation'; flag:
    the folder's flag name); FolderInUse when a live process holds it, WriteFailed when it cannot be written."""
    path = os.path.join(folder, LOCK_FILENAME)
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        reason = write_failure(error)
        if reason is None:
            raise
        raise write_failed(folder, reason, f'{usage} could not start') from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd) or (time.sleep(0.5) or _read_holder(fd))  # it may be writing who it is
        os.close(fd)
        raise FolderInUse(f'{folder} is in use by {_describe_holder(holder)} for {usage}: stop it, or give '
                          f'another --{flag}') from None
    if os.path.exists(path) and os.stat(path).st_ino != os.fstat(fd).st_ino:
        # The folder was moved or deleted under a running process while this one opened its lock: start again.
        os.close(fd)
        return hold_folder(folder, usage, flag, report)
    previous = _read_holder(fd)
    if previous:
        report(f'{folder}: its lock names {_describe_holder(previous)}, which ended without releasing it '
               f'(killed, crashed or copied): taking it over.')
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(dict(_holder(), usage=usage)) + '\n').encode())
    except OSError as error:
        os.close(fd)
        reason = write_failure(error)
        if reason is None:
            raise
        raise write_failed(folder, reason, f'{usage} could not start') from None
    lock = FolderLock(folder, fd)
    atexit.register(lock.release)
    return lock


def process_alive(pid):
    """Returns whether a process with this id runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
