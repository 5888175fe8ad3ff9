"""Tests of onu_checkpoint.py and of what the scripts do with damaged, moved, copied and stopped runs.

Everything is real: the checkpoint files of conftest's shared tiny run (checkpoints at steps 0, 2,
..., 12), copied and damaged on disk; the training, evaluation and export scripts as subprocesses;
a real SIGTERM.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import tensorflow as tf

from conftest import copy_train_dir, file_states, finish, run_script, start_script, session_events
from test_onu_train import TIMEOUT_SECS, TINY_FLAGS, checkpoint_step, logged_steps, run_train

from onu_lib import onu_checkpoint
from onu_lib import onu_errors
from onu_lib import onu_run_folder


def copy_run(tiny_run, tmp_path, name='run'):
    """Returns a copy of the shared run's train_dir in tmp_path, without its exports (none is read here)."""
    return copy_train_dir(tiny_run, tmp_path, name, exports=False)


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


DAMAGE = ('data_cut', 'data_missing', 'index_unreadable')


# ---------------------------------------------------------------------------------------------
# The library on real files.

def test_list_checkpoints_and_their_steps(tiny_run):
    train_dir = tiny_run.train_dir
    steps = list(range(0, 13, 2))
    paths = onu_checkpoint.list_checkpoints(train_dir)
    assert paths == [prefix(train_dir, step) for step in steps]
    assert [onu_checkpoint.checkpoint_step(path) for path in paths] == steps
    assert [onu_checkpoint.listed_step(path) for path in paths] == steps
    assert onu_checkpoint.newest_readable(train_dir) == (prefix(train_dir, 12), [])
    assert onu_checkpoint.find_checkpoint(train_dir) == prefix(train_dir, 12)


def test_warm_start_errors_name_the_fine_tune_checkpoint_flag(tiny_run, tmp_path):
    empty, notes = tmp_path / 'empty', tmp_path / 'notes.txt'
    empty.mkdir()
    notes.write_text('not a checkpoint')
    with tf.Graph().as_default():
        tf.compat.v1.get_variable('Other/weights', [2])  # a model with none of the shared run's variables
        for source, words in ((empty, 'no checkpoint in this folder'), (notes, 'not a readable checkpoint'),
                              (tiny_run.train_dir, 'no model variable matches this checkpoint')):
            with pytest.raises(onu_errors.DataError) as error:
                onu_checkpoint.warm_start_saver(str(source), [], report=lambda line: None)
            message = str(error.value)
            assert words in message and '--fine_tune_checkpoint' in message, message
            assert '--checkpoint_path' not in message and '\n' not in message, message


@pytest.mark.parametrize('kind', DAMAGE)
def test_damaged_checkpoints_are_found_and_set_aside_never_deleted(tiny_run, tmp_path, kind):
    train_dir = copy_run(tiny_run, tmp_path)
    damage(prefix(train_dir, 12), kind)
    with pytest.raises(onu_checkpoint.DamagedCheckpoint) as error:
        onu_checkpoint.check_readable(prefix(train_dir, 12))
    message = str(error.value)
    assert message.startswith(f'{prefix(train_dir, 12)}: damaged checkpoint (') and '\n' not in message
    newest, damaged = onu_checkpoint.newest_readable(train_dir)
    assert newest == prefix(train_dir, 10) and [e.path for e in damaged] == [prefix(train_dir, 12)]

    with pytest.raises(onu_errors.DataError) as error:  # what export and predict say
        onu_checkpoint.find_checkpoint(train_dir)
    message = str(error.value)
    assert prefix(train_dir, 12) in message and f'the newest readable one is {prefix(train_dir, 10)}' in message
    assert f'--checkpoint_path={prefix(train_dir, 10)}' in message and '\n' not in message

    before = {name for name in os.listdir(train_dir) if name.startswith('model.ckpt-12.')}
    warnings = []
    assert onu_checkpoint.prepare_resume(train_dir, warn=warnings.append) == prefix(train_dir, 10)
    assert len(warnings) == 1 and 'model.ckpt-12' in warnings[0] and 'moved aside' in warnings[0]
    after = {name for name in os.listdir(train_dir) if '.damaged.' in name}
    assert after == {name.replace('model.ckpt-12.', 'model.ckpt-12.damaged.') for name in before}  # all kept
    state = tf.train.get_checkpoint_state(train_dir)
    assert state.model_checkpoint_path == prefix(train_dir, 10)
    with open(os.path.join(train_dir, 'checkpoint')) as f:
        assert train_dir not in f.read()  # relative paths only


# ---------------------------------------------------------------------------------------------
# The scripts.

# Each kind of damage is found and set aside by the library (above); the scripts are run on one kind each.

def test_training_resumes_from_the_newest_readable_checkpoint(tiny_run, tmp_path):
    data_dir = tiny_run.data_dir
    train_dir = copy_run(tiny_run, tmp_path)
    damage(prefix(train_dir, 12), 'index_unreadable')
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=13')
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stdout.splitlines() if 'damaged checkpoint' in line]
    assert len(warnings) == 1 and prefix(train_dir, 12) in warnings[0] and 'resuming from' in warnings[0]
    assert 'Traceback' not in result.stderr
    assert logged_steps(result.stdout) == [12, 13]  # 11, 12 and 13 trained again from step 10 (11 is the first)
    assert checkpoint_step(train_dir) == 13
    assert any(name.startswith('model.ckpt-12.damaged.') for name in os.listdir(train_dir))


def test_eval_skips_a_damaged_checkpoint_with_a_note(tiny_run, tmp_path):
    train_dir = copy_run(tiny_run, tmp_path)
    damage(prefix(train_dir, 12), 'data_missing')
    eval_dir = str(tmp_path / 'eval')
    result = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--run_once')
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stdout.splitlines() if 'damaged checkpoint' in line]
    assert len(notes) == 1 and notes[0].startswith(f'skipping {prefix(train_dir, 12)}: damaged checkpoint (')
    assert 'step 10, precision @ 1 = ' in result.stdout and 'Traceback' not in result.stderr


def test_export_and_predict_name_the_damaged_checkpoint_and_the_alternative(tiny_run, tmp_path):
    data_dir = tiny_run.data_dir
    train_dir = copy_run(tiny_run, tmp_path)
    damage(prefix(train_dir, 12), 'data_cut')
    exported = run_script('onu_export.py', f'--checkpoint_dir={train_dir}')
    assert exported.returncode == 2
    error = exported.stderr.strip().splitlines()[-1]
    assert error.startswith(f'error: {prefix(train_dir, 12)}: damaged checkpoint (')
    newest = prefix(train_dir, 10)
    assert f'the newest readable one is {newest}: pass --checkpoint_path={newest}' in error
    assert 'Traceback' not in exported.stderr and not os.path.exists(os.path.join(train_dir, 'export', '12'))
    photo = os.path.join(data_dir, 'val', 'F603', sorted(os.listdir(os.path.join(data_dir, 'val', 'F603')))[0])
    predicted = run_script('onu_predict.py', f'--model_dir={train_dir}', photo)
    assert predicted.returncode == 2
    error = predicted.stderr.strip().splitlines()[-1]
    assert prefix(train_dir, 12) in error and f'--checkpoint_path={prefix(train_dir, 10)}' in error
    assert 'Traceback' not in predicted.stderr


def test_moved_run_resumes_and_evaluates_where_it_is_now(tiny_run, tmp_path):
    data_dir = tiny_run.data_dir
    original = copy_run(tiny_run, tmp_path, 'original')
    moved = str(tmp_path / 'moved')
    os.rename(original, moved)  # the original folder is gone
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={moved}', '--max_steps=14')
    assert result.returncode == 0, result.stderr[-3000:]
    assert logged_steps(result.stdout)[-1] == 14 and checkpoint_step(moved) == 14
    with open(os.path.join(moved, 'checkpoint')) as f:
        state = f.read()
    assert 'model_checkpoint_path: "model.ckpt-14"' in state and original not in state
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={moved}', f'--eval_dir={tmp_path / "eval"}',
                           '--run_once')
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert 'step 14, precision @ 1 = ' in evaluated.stdout
    assert not os.path.exists(original)


def test_copied_run_never_reads_or_writes_the_original(tiny_run, tmp_path):
    data_dir = tiny_run.data_dir
    original = copy_run(tiny_run, tmp_path, 'original')
    copy = str(tmp_path / 'copy')
    shutil.copytree(original, copy)
    # Were the copy to read the original's checkpoint, this damage would show in its output.
    damage(prefix(original, 12), 'data_cut')
    before = file_states(original)
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={copy}', '--max_steps=14', '--keep_checkpoint_max=2')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'damaged' not in result.stdout + result.stderr
    assert logged_steps(result.stdout) == [14] and checkpoint_step(copy) == 14  # resumed from its own step 12
    assert file_states(original) == before  # nothing written, renamed or deleted there (max_to_keep included)
    assert onu_checkpoint.list_checkpoints(copy)[-2:] == [prefix(copy, 12), prefix(copy, 14)]  # saved at start, end


def test_sigterm_saves_a_checkpoint_at_the_current_step(tiny_run, tmp_path):
    train_dir = str(tmp_path / 'stopped')
    process = start_script('onu_train.py', *TINY_FLAGS, f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}',
                           '--max_steps=100000',  # checkpoints only every 600 s
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines, deadline = [], time.monotonic() + TIMEOUT_SECS
    for line in process.stdout:
        lines.append(line)
        if len(logged_steps(''.join(lines))) >= 3 or time.monotonic() > deadline:
            break
    process.send_signal(signal.SIGTERM)
    rest, errors = finish(process, TIMEOUT_SECS)
    stdout = ''.join(lines) + rest
    assert process.returncode == 128 + signal.SIGTERM, errors[-3000:]
    last_logged = logged_steps(stdout)[-1]
    saved = checkpoint_step(train_dir)
    assert saved >= last_logged >= 3
    stopped = [line for line in stdout.splitlines() if line.startswith('Stopped by SIGTERM')]
    assert stopped == [f'Stopped by SIGTERM at step {saved}: checkpoint saved as {prefix(train_dir, saved)}; '
                       f'run the same command again to resume from it.']
    assert 'Traceback' not in errors
    # README "Comparing runs": a run stopped by a signal stays "running" in the HParams tab (no end, no success).
    assert [kind for kind, _ in session_events(train_dir)] == ['start']


def test_a_restarted_evaluator_reports_each_checkpoint_once(tiny_run, tmp_path):
    train_dir = tiny_run.train_dir  # only read
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
    assert steps == list(range(0, 13, 2))


@pytest.mark.parametrize('change', [{'validation_percent': 20.0}, {'labels_offset': 1}, {'image_size': 48},
                                    {'model': 'inception_resnet_v2'},
                                    {'class_names': ('F603', 'F670L')}])  # as many classes, one renamed
def test_resuming_needs_the_same_model_classes_labels_and_split(tiny_run, change):
    saved = tiny_run.config.replace(validation_percent=10.0)
    onu_checkpoint.check_resumable(tiny_run.train_dir, saved, saved)  # the same: resumes
    with pytest.raises(onu_errors.DataError) as error:
        onu_checkpoint.check_resumable(tiny_run.train_dir, saved.replace(**change), saved)
    (key, value), = change.items()
    assert str(error.value).startswith(f'{tiny_run.train_dir} holds a run with {key}={getattr(saved, key)!r}, '
                                       f'not {value!r}')


# ---------------------------------------------------------------------------------------------
# A finished run started again.

def test_a_finished_run_started_again_says_so_and_trains_nothing(tiny_run, tmp_path):
    train_dir = copy_run(tiny_run, tmp_path)
    before = file_states(train_dir)
    again = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}', '--max_steps=12')
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == (
        f'{train_dir}: the run is complete at step 12 (--max_steps=12); to train on, run it again with a larger '
        f'--max_steps')
    assert logged_steps(again.stdout) == [] and onu_checkpoint.list_checkpoints(train_dir)[-1].endswith('-12')
    changed = {path for path in file_states(train_dir).keys() | before.keys()
               if file_states(train_dir).get(path) != before.get(path)}
    assert changed <= {os.path.join(train_dir, onu_run_folder.LOCK_FILENAME)}
