"""Tests of onu_lib/onu_run_folder.py: one process per run folder (the lock, refused and taken over), and writes
that fail (a full disk, a read-only folder), with the real scripts as subprocesses on copies of conftest's tiny run
and real signals.
"""
import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import file_states, finish, mount, read_only_bind_mount, run_script, start_script
from test_onu_checkpoint import copy_run
from test_onu_train import TIMEOUT_SECS, TINY_FLAGS, checkpoint_step, logged_steps, run_train

from onu_lib import onu_checkpoint
from onu_lib import onu_run_folder


def start_training(tiny_run, train_dir, *args):
    """Starts onu_train.py on the shared run's data into train_dir; returns (process, lines read) once it logs a step."""
    process = start_script('onu_train.py', *TINY_FLAGS, f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}',
                           *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    lines, deadline = [], time.monotonic() + TIMEOUT_SECS
    for line in process.stdout:
        lines.append(line)
        if logged_steps(''.join(lines)) or time.monotonic() > deadline:
            break
    assert logged_steps(''.join(lines)), ''.join(lines) + process.stderr.read()[-3000:]
    return process, lines


def one_error_line(result):
    """The one line of a script that stopped: its whole stderr, checked to be one `error: ...` line."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and 'Traceback' not in result.stderr, result.stderr[-3000:]
    return lines[0]


@pytest.mark.script
def test_a_second_trainer_on_a_folder_in_use_is_refused_and_the_first_goes_on(tiny_run, tmp_path):
    train_dir = copy_run(tiny_run, tmp_path)
    first, lines = start_training(tiny_run, train_dir, '--max_steps=100000', '--save_checkpoint_steps=50')
    before = {name for name in os.listdir(train_dir) if name.startswith('events.out')}
    started = time.monotonic()
    second = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}', '--max_steps=60')
    assert time.monotonic() - started < 30 and second.returncode == 2
    line = one_error_line(second)
    assert line.startswith(f'error: {train_dir} is in use by onu_train.py (pid {first.pid} on ')
    assert 'for training: stop it, or give another --train_dir' in line
    assert first.poll() is None  # still training, as if alone
    first.send_signal(signal.SIGTERM)
    rest, errors = finish(first, TIMEOUT_SECS)
    assert first.returncode == 128 + signal.SIGTERM, errors[-3000:]
    steps = logged_steps(''.join(lines) + rest)
    assert steps == list(range(14, steps[-1] + 1)) and checkpoint_step(train_dir) >= steps[-1]  # every step once
    # The refused trainer wrote nothing: no event file of its own, the first's run configuration kept.
    assert {name for name in os.listdir(train_dir) if name.startswith('events.out')} == before
    assert json.load(open(os.path.join(train_dir, 'run_config.json')))['max_steps'] == 100000


@pytest.mark.script
def test_a_clean_end_leaves_nothing_to_take_over_and_a_killed_trainers_lock_is_taken_over(tiny_run, tmp_path):
    train_dir = copy_run(tiny_run, tmp_path)  # with the lock file the shared run left when it ended normally
    stopped, lines = start_training(tiny_run, train_dir, '--max_steps=100000')
    stopped.send_signal(signal.SIGTERM)  # a clean stop too
    rest, errors = finish(stopped, TIMEOUT_SECS)
    assert stopped.returncode == 128 + signal.SIGTERM, errors[-3000:]
    killed, started = start_training(tiny_run, train_dir, '--max_steps=100000', '--save_checkpoint_steps=2')
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    for start in (''.join(lines) + rest, ''.join(started)):
        assert 'taking it over' not in start, start
    resumed = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}',
                        f'--max_steps={checkpoint_step(train_dir) + 2}')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f'{train_dir}: its lock names onu_train.py (pid {killed.pid} on ' in resumed.stdout
            and 'which ended without releasing it (killed, crashed or copied): taking it over.' in resumed.stdout)


# ----------------------------------------------------------------------------------------------
# The lock and the write failures in this process, against real other processes

# Another process holding a run folder as a script does: flock on the lock file, its holder written in it.
HOLD_AND_WAIT = ('import fcntl, json, os, sys, time; lock = open({path!r}, "a+"); fcntl.flock(lock, fcntl.LOCK_EX); '
                 'lock.truncate(0); lock.write(json.dumps({{"pid": os.getpid(), "host": "a-host", "started": "then", '
                 '"command": "onu_train.py", "usage": "training"}})); lock.flush(); print("held", flush=True); {then}')


def _hold_in_another_process(folder, then):
    """Starts a Python process that holds folder's lock, then runs `then`; returns it once it holds it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, onu_run_folder.LOCK_FILENAME)
    process = subprocess.Popen([sys.executable, '-c', HOLD_AND_WAIT.format(path=path, then=then)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == 'held'
    return process


def test_a_folder_held_by_a_live_process_is_refused_naming_it(tmp_path):
    folder = str(tmp_path / 'run')
    holder = _hold_in_another_process(folder, 'time.sleep(60)')
    try:
        with pytest.raises(onu_run_folder.FolderInUse) as error:
            onu_run_folder.hold_folder(folder, 'evaluation', 'eval_dir', report=pytest.fail)
        message = str(error.value)
        assert message.startswith(f'{folder} is in use by onu_train.py (pid {holder.pid} on a-host, started then)')
        assert message.endswith('for evaluation: stop it, or give another --eval_dir') and '\n' not in message
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_released_says_nothing_and_one_left_by_a_dead_process_is_taken_over_once(tmp_path):
    folder = str(tmp_path / 'run')
    onu_run_folder.hold_folder(folder, 'training', 'train_dir', report=pytest.fail).release()
    lock_path = os.path.join(folder, onu_run_folder.LOCK_FILENAME)
    assert os.path.getsize(lock_path) == 0  # released: nobody named, nothing to take over
    onu_run_folder.hold_folder(folder, 'training', 'train_dir', report=pytest.fail).release()
    dead = _hold_in_another_process(folder, 'import os; os._exit(0)')  # ends without releasing it
    dead.wait()
    reports = []
    lock = onu_run_folder.hold_folder(folder, 'training', 'train_dir', report=reports.append)
    assert len(reports) == 1 and f'its lock names onu_train.py (pid {dead.pid} on a-host' in reports[0]
    assert reports[0].endswith('which ended without releasing it (killed, crashed or copied): taking it over.')
    held = json.load(open(lock_path))
    assert (held['pid'], held['host'], held['usage']) == (os.getpid(), socket.gethostname(), 'training')
    assert os.stat(lock_path).st_mode & stat.S_IROTH  # another user can read who holds the folder
    lock.release()
    onu_run_folder.hold_folder(folder, 'training', 'train_dir', report=pytest.fail).release()


@pytest.mark.parametrize('left, named', [
    ('{"pid": 7, "command": "onu_tr', 'an unknown process (pid ? on ?, started ?)'),  # cut off while being written
    ('{"pid": 7}', 'a process (pid 7 on ?, started ?)'),  # written by an older version
    ('[1, 2]', None),  # not a holder: nothing to take over
])
def test_a_lock_left_half_written_is_taken_over_naming_what_it_can(tmp_path, left, named):
    folder = str(tmp_path / 'run')
    os.makedirs(folder)
    with open(os.path.join(folder, onu_run_folder.LOCK_FILENAME), 'w') as f:
        f.write(left)
    reports = []
    onu_run_folder.hold_folder(folder, 'training', 'train_dir', report=reports.append).release()
    assert reports == ([f'{folder}: its lock names {named}, which ended without releasing it (killed, crashed or '
                        f'copied): taking it over.'] if named else [])


def test_a_folder_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    mounted = str(tmp_path / 'read_only')
    mount(mounted, '-t', 'tmpfs', '-o', 'size=1m,ro', 'tmpfs')
    try:
        for folder in (mounted, os.path.join(mounted, 'run')):  # the lock file, or the folder, cannot be made
            with pytest.raises(onu_run_folder.WriteFailed) as error:
                onu_run_folder.hold_folder(folder, 'training', 'train_dir', report=pytest.fail)
            assert str(error.value) == (f'{folder}: the file system is read-only (training could not start); make '
                                        f'{folder} writable, or use another folder, then run the same command again')
        assert os.listdir(mounted) == []
    finally:
        subprocess.run(['umount', mounted], check=True)


@pytest.mark.parametrize('error, in_folder, anywhere', [
    (OSError(errno.ENOSPC, 'No space left on device', '{folder}/model.ckpt-3.data'), 'the disk is full', 'the disk is full'),
    (OSError(errno.EDQUOT, 'Disk quota exceeded', '{folder}/events'), 'the disk quota is used up',
     'the disk quota is used up'),
    (OSError(errno.EROFS, 'Read-only file system', '{folder}/x'), 'the file system is read-only',
     'the file system is read-only'),
    (OSError(errno.EACCES, 'Permission denied', '{folder}/x'), 'permission denied', 'permission denied'),
    (OSError(errno.ENOSPC, 'No space left on device', '/elsewhere/x'), None, 'the disk is full'),  # another folder's
    (OSError(errno.ENOENT, 'No such file or directory', '{folder}/x'), None, None),  # not a write that failed
    (Exception('{folder}/model.ckpt-3.index; No space left on device'), 'the disk is full', 'the disk is full'),
    (Exception('/elsewhere/y; Read-only file system'), None, 'the file system is read-only'),  # TensorFlow's words
])
def test_a_write_failure_is_told_by_its_reason_and_only_for_the_folders_files(tmp_path, error, in_folder, anywhere):
    folder = str(tmp_path / 'run')
    if isinstance(error, OSError):
        error = OSError(error.errno, error.strerror, error.filename.format(folder=folder))
    else:
        error = Exception(str(error).format(folder=folder))
    assert onu_run_folder.write_failure(error, folder) == in_folder
    assert onu_run_folder.write_failure(error) == anywhere


def _checkpoint(folder, step):
    """Writes a real checkpoint of one variable at step into folder; returns its path."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        tf.compat.v1.get_variable('weights', initializer=tf.zeros([2]))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(session, os.path.join(folder, 'model.ckpt'), global_step=step)


def test_a_failed_write_names_the_folder_the_reason_and_the_checkpoint_to_resume_from(tmp_path):
    train_dir = str(tmp_path / 'train')
    for step in (2, 4):
        newest = _checkpoint(train_dir, step)
    failed = onu_run_folder.write_failed(train_dir, 'the disk is full', 'saving a checkpoint', train_dir)
    assert str(failed) == (f'{train_dir}: the disk is full (saving a checkpoint); the newest complete checkpoint is '
                           f'{newest}: free some space, then run the same command again to resume from it')
    empty = str(tmp_path / 'empty')
    os.makedirs(empty)
    assert str(onu_run_folder.write_failed(empty, 'permission denied', 'training', empty)) == (
        f'{empty}: permission denied (training); there is no complete checkpoint yet: make {empty} writable, or use '
        f'another folder, then run the same command again')
    assert str(onu_run_folder.write_failed(empty, 'the disk quota is used up', 'evaluation')) == (
        f'{empty}: the disk quota is used up (evaluation); free some space, then run the same command again')


@pytest.mark.script
def test_a_second_evaluator_on_an_eval_folder_in_use_is_refused(tiny_run, tmp_path):
    eval_dir = str(tmp_path / 'eval')
    first = start_script('onu_eval.py', f'--checkpoint_dir={tiny_run.train_dir}', f'--eval_dir={eval_dir}',
                         '--eval_interval_secs=0.2', stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT_SECS
    while not os.path.exists(os.path.join(eval_dir, onu_run_folder.LOCK_FILENAME)) and time.monotonic() < deadline:
        time.sleep(0.1)
    second = run_script('onu_eval.py', f'--checkpoint_dir={tiny_run.train_dir}', f'--eval_dir={eval_dir}',
                        '--run_once')
    assert second.returncode == 2
    assert one_error_line(second).startswith(f'error: {eval_dir} is in use by onu_eval.py (pid {first.pid} on ')
    rest, errors = first.communicate(timeout=TIMEOUT_SECS)
    assert first.returncode == 0, errors[-3000:]
    with open(os.path.join(eval_dir, 'results.jsonl')) as f:  # the first's results only, each checkpoint once
        assert [json.loads(line)['step'] for line in f] == list(range(0, 13, 2))
    assert len([name for name in os.listdir(eval_dir) if name.startswith('events.out')]) == 1


@pytest.mark.script
def test_a_full_disk_stops_training_with_one_line_and_the_run_resumes_elsewhere(tiny_run, tmp_path):
    small = str(tmp_path / 'small')
    mount(small, '-t', 'tmpfs', '-o', 'size=16m', 'tmpfs')
    try:
        train_dir = os.path.join(small, 'train')
        full = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}', '--max_steps=30',
                         '--save_checkpoint_steps=2', '--keep_checkpoint_max=20')
        assert full.returncode == 1
        line = one_error_line(full)
        newest, _ = onu_checkpoint.newest_readable(train_dir)
        assert newest is not None and line == (
            f'error: {train_dir}: the disk is full (saving a checkpoint); the newest complete checkpoint is '
            f'{newest}: free some space, then run the same command again to resume from it')
        onu_checkpoint.check_readable(newest)
        # Nothing half-written looks complete: every listed checkpoint reads back.
        for path in onu_checkpoint.list_checkpoints(train_dir):
            onu_checkpoint.check_readable(path)
        moved = str(tmp_path / 'moved')
        shutil.copytree(train_dir, moved)
    finally:
        subprocess.run(['umount', small], check=True)
    resumed = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={moved}', '--max_steps=30',
                        '--save_checkpoint_steps=2')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert logged_steps(resumed.stdout)[0] == onu_checkpoint.listed_step(newest) + 2 and checkpoint_step(moved) == 30


@pytest.mark.script
def test_a_read_only_train_dir_is_one_line(tiny_run, tmp_path):
    train_dir = copy_run(tiny_run, tmp_path)
    mounted = str(tmp_path / 'read_only')
    with read_only_bind_mount(train_dir, mounted):
        before = file_states(train_dir)
        refused = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={mounted}', '--max_steps=20')
        assert refused.returncode == 1
        assert one_error_line(refused) == (
            f'error: {mounted}: the file system is read-only (training could not start); make {mounted} writable, '
            f'or use another folder, then run the same command again')
        assert file_states(train_dir) == before
