"""Tests of onu_checkpoint.py and of what the scripts do with damaged, moved, copied and stopped runs.

Everything is real: a tiny training run's checkpoint files, damaged on disk; the training,
evaluation and export scripts as subprocesses; a real SIGTERM.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from conftest import REPO_ROOT
from test_onu_train import TINY_FLAGS, checkpoint_step, logged_steps, run_train

import onu_sample_data
import onu_checkpoint
import onu_dataset

TIMEOUT_SECS = 240
SUBPROCESS_ENV = dict(os.environ)


def run_script(script, *args):
    """Runs a repo script with args; returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, script), *args], capture_output=True,
                          text=True, timeout=TIMEOUT_SECS, env=SUBPROCESS_ENV, cwd=REPO_ROOT)


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
    """A tiny 6-step run with checkpoints at steps 0, 2, 4 and 6: (data_dir, train_dir). Copy before changing it."""
    root = tmp_path_factory.mktemp('checkpoints')
    data_dir, train_dir = str(root / 'data'), str(root / 'train')
    onu_sample_data.generate_dataset(data_dir, 4, 2, (64, 48), seed=0, processes=1)
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=6',
                       '--save_checkpoint_steps=2', '--keep_checkpoint_max=20', '--seed=1')
    assert result.returncode == 0, result.stderr[-3000:]
    return data_dir, train_dir


def copy_run(finished_run, tmp_path, name='run'):
    """Returns a copy of the finished run's train_dir in tmp_path."""
    copy = str(tmp_path / name)
    shutil.copytree(finished_run[1], copy)
    return copy


def prefix(train_dir, step):
    """Returns the checkpoint prefix of step in train_dir."""
    return os.path.join(train_dir, f'model.ckpt-{step}')


def data_file(path):
    """Returns the data file of a checkpoint prefix."""
    return path + '.data-00000-of-00001'


def damage(path, kind):
    """Damages the checkpoint prefix path: its data file cut short or missing, or its index garbage."""
    if kind == 'data_cut':
        size = os.path.getsize(data_file(path))
        with open(data_file(path), 'r+b') as f:
            f.truncate(size // 2)
    elif kind == 'data_missing':
        os.remove(data_file(path))
    elif kind == 'index_unreadable':
        with open(path + '.index', 'wb') as f:
            f.write(b'not a checkpoint index' * 10)
    else:
        raise ValueError(kind)


def listing(directory):
    """Returns {file name: (size, mtime)} of a folder."""
    return {name: (os.path.getsize(os.path.join(directory, name)), os.path.getmtime(os.path.join(directory, name)))
            for name in os.listdir(directory)}


DAMAGE = ('data_cut', 'data_missing', 'index_unreadable')


# ---------------------------------------------------------------------------------------------
# The library on real files.

def test_list_checkpoints_and_their_steps(finished_run):
    _, train_dir = finished_run
    paths = onu_checkpoint.list_checkpoints(train_dir)
    assert paths == [prefix(train_dir, step) for step in (0, 2, 4, 6)]
    assert [onu_checkpoint.checkpoint_step(path) for path in paths] == [0, 2, 4, 6]
    assert [onu_checkpoint.listed_step(path) for path in paths] == [0, 2, 4, 6]
    assert onu_checkpoint.newest_readable(train_dir) == (prefix(train_dir, 6), [])
    assert onu_checkpoint.find_checkpoint(train_dir) == prefix(train_dir, 6)


@pytest.mark.parametrize('kind', DAMAGE)
def test_damaged_checkpoints_are_found_and_set_aside_never_deleted(finished_run, tmp_path, kind):
    train_dir = copy_run(finished_run, tmp_path)
    damage(prefix(train_dir, 6), kind)
    with pytest.raises(onu_checkpoint.DamagedCheckpoint) as error:
        onu_checkpoint.check_readable(prefix(train_dir, 6))
    assert str(error.value).startswith(f'{prefix(train_dir, 6)}: damaged checkpoint (') and '\n' not in str(error.value)
    newest, damaged = onu_checkpoint.newest_readable(train_dir)
    assert newest == prefix(train_dir, 4) and [e.path for e in damaged] == [prefix(train_dir, 6)]

    with pytest.raises(onu_dataset.DataError) as error:  # what export and predict say
        onu_checkpoint.find_checkpoint(train_dir)
    message = str(error.value)
    assert prefix(train_dir, 6) in message and f'the newest readable one is {prefix(train_dir, 4)}' in message
    assert f'--checkpoint_path={prefix(train_dir, 4)}' in message and '\n' not in message

    before = {name for name in os.listdir(train_dir) if name.startswith('model.ckpt-6.')}
    warnings = []
    assert onu_checkpoint.prepare_resume(train_dir, warn=warnings.append) == prefix(train_dir, 4)
    assert len(warnings) == 1 and 'model.ckpt-6' in warnings[0] and 'moved aside' in warnings[0]
    after = {name for name in os.listdir(train_dir) if '.damaged.' in name}
    assert after == {name.replace('model.ckpt-6.', 'model.ckpt-6.damaged.') for name in before}  # all kept
    state = tf.train.get_checkpoint_state(train_dir)
    assert state.model_checkpoint_path == prefix(train_dir, 4)
    with open(os.path.join(train_dir, 'checkpoint')) as f:
        assert train_dir not in f.read()  # relative paths only


# ---------------------------------------------------------------------------------------------
# The scripts.

@pytest.mark.parametrize('kind', DAMAGE)
def test_training_resumes_from_the_newest_readable_checkpoint(finished_run, tmp_path, kind):
    data_dir, _ = finished_run
    train_dir = copy_run(finished_run, tmp_path)
    damage(prefix(train_dir, 6), kind)
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=7')
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stdout.splitlines() if 'damaged checkpoint' in line]
    assert len(warnings) == 1 and prefix(train_dir, 6) in warnings[0] and 'resuming from' in warnings[0]
    assert 'Traceback' not in result.stderr
    assert logged_steps(result.stdout) == [6, 7]  # steps 5, 6 and 7 trained again from step 4 (5 is the first)
    assert checkpoint_step(train_dir) == 7
    assert any(name.startswith('model.ckpt-6.damaged.') for name in os.listdir(train_dir))


@pytest.mark.parametrize('kind', DAMAGE)
def test_eval_skips_a_damaged_checkpoint_with_a_note(finished_run, tmp_path, kind):
    train_dir = copy_run(finished_run, tmp_path)
    damage(prefix(train_dir, 6), kind)
    eval_dir = str(tmp_path / 'eval')
    result = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--run_once')
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stdout.splitlines() if 'damaged checkpoint' in line]
    assert len(notes) == 1 and notes[0].startswith(f'skipping {prefix(train_dir, 6)}: damaged checkpoint (')
    assert 'step 4, precision @ 1 = ' in result.stdout and 'Traceback' not in result.stderr


def test_export_and_predict_name_the_damaged_checkpoint_and_the_alternative(finished_run, tmp_path):
    data_dir, _ = finished_run
    train_dir = copy_run(finished_run, tmp_path)
    damage(prefix(train_dir, 6), 'data_cut')
    exported = run_script('onu_export.py', f'--checkpoint_dir={train_dir}')
    assert exported.returncode == 2
    error = exported.stderr.strip().splitlines()[-1]
    assert error.startswith(f'error: {prefix(train_dir, 6)}: damaged checkpoint (')
    assert f'the newest readable one is {prefix(train_dir, 4)}: pass --checkpoint_path={prefix(train_dir, 4)}' in error
    assert 'Traceback' not in exported.stderr and not os.path.exists(os.path.join(train_dir, 'export', '6'))
    photo = os.path.join(data_dir, 'val', 'F603', sorted(os.listdir(os.path.join(data_dir, 'val', 'F603')))[0])
    predicted = run_script('onu_predict.py', f'--model_dir={train_dir}', photo)
    assert predicted.returncode == 2
    error = predicted.stderr.strip().splitlines()[-1]
    assert prefix(train_dir, 6) in error and f'--checkpoint_path={prefix(train_dir, 4)}' in error
    assert 'Traceback' not in predicted.stderr


def test_moved_run_resumes_and_evaluates_where_it_is_now(finished_run, tmp_path):
    data_dir, _ = finished_run
    original = copy_run(finished_run, tmp_path, 'original')
    moved = str(tmp_path / 'moved')
    os.rename(original, moved)  # the original folder is gone
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={moved}', '--max_steps=8')
    assert result.returncode == 0, result.stderr[-3000:]
    assert logged_steps(result.stdout)[-1] == 8 and checkpoint_step(moved) == 8
    with open(os.path.join(moved, 'checkpoint')) as f:
        state = f.read()
    assert 'model_checkpoint_path: "model.ckpt-8"' in state and original not in state
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={moved}', f'--eval_dir={tmp_path / "eval"}',
                           '--run_once')
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert 'step 8, precision @ 1 = ' in evaluated.stdout
    assert not os.path.exists(original)


def test_copied_run_never_reads_or_writes_the_original(finished_run, tmp_path):
    data_dir, _ = finished_run
    original = copy_run(finished_run, tmp_path, 'original')
    copy = str(tmp_path / 'copy')
    shutil.copytree(original, copy)
    # Were the copy to read the original's checkpoint, this damage would show in its output.
    damage(prefix(original, 6), 'data_cut')
    before = listing(original)
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={copy}', '--max_steps=8', '--keep_checkpoint_max=2')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'damaged' not in result.stdout + result.stderr
    assert logged_steps(result.stdout) == [8] and checkpoint_step(copy) == 8  # resumed from its own step 6
    assert listing(original) == before  # nothing written, renamed or deleted there (max_to_keep included)
    assert onu_checkpoint.list_checkpoints(copy)[-2:] == [prefix(copy, 6), prefix(copy, 8)]  # saved at start, end


def test_sigterm_saves_a_checkpoint_at_the_current_step(finished_run, tmp_path):
    data_dir, _ = finished_run
    train_dir = str(tmp_path / 'stopped')
    command = [sys.executable, os.path.join(REPO_ROOT, 'onu_train.py'), *TINY_FLAGS, f'--data_dir={data_dir}',
               f'--train_dir={train_dir}', '--max_steps=100000']  # checkpoints only every 600 s
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=SUBPROCESS_ENV, cwd=REPO_ROOT)
    lines, deadline = [], time.monotonic() + TIMEOUT_SECS
    for line in process.stdout:
        lines.append(line)
        if len(logged_steps(''.join(lines))) >= 3 or time.monotonic() > deadline:
            break
    process.send_signal(signal.SIGTERM)
    rest, errors = process.communicate(timeout=TIMEOUT_SECS)
    stdout = ''.join(lines) + rest
    assert process.returncode == 128 + signal.SIGTERM, errors[-3000:]
    last_logged = logged_steps(stdout)[-1]
    saved = checkpoint_step(train_dir)
    assert saved >= last_logged >= 3
    stopped = [line for line in stdout.splitlines() if line.startswith('Stopped by SIGTERM')]
    assert stopped == [f'Stopped by SIGTERM at step {saved}: checkpoint saved as {prefix(train_dir, saved)}; '
                       f'run the same command again to resume from it.']
    assert 'Traceback' not in errors


def test_a_restarted_evaluator_reports_each_checkpoint_once(finished_run, tmp_path):
    _, train_dir = finished_run
    eval_dir = str(tmp_path / 'eval')
    first = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}',
                       '--eval_interval_secs=0.2')
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}',
                        '--eval_interval_secs=0.2')
    assert second.returncode == 0, second.stderr[-3000:]
    assert 'precision @ 1 = ' not in second.stdout and 'already evaluated: done' in second.stdout
    with open(os.path.join(eval_dir, 'results.jsonl')) as f:
        steps = [json.loads(line)['step'] for line in f]
    assert steps == [0, 2, 4, 6]
