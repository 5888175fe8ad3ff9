"""Tests of onu_lib/onu_best.py: the best checkpoint kept in EVAL_DIR/best/ (real checkpoint files in a tmp dir);
the evaluator keeping it is tested in test_onu_eval.py."""
import contextlib
import json
import os
import shutil

import pytest
import tensorflow as tf

from test_onu_run_folder import _checkpoint

from onu_lib import onu_best
from onu_lib import onu_checkpoint
from onu_lib import onu_run_config


def _record(step, precision, loss, eval_data='val', num_examples=4):
    """A results.jsonl record with the fields the best is decided and kept by."""
    return {'step': step, 'precision_at_1': precision, 'loss': loss, 'eval_data': eval_data,
            'num_examples': num_examples}


@pytest.mark.parametrize('record, best, beats', [
    (_record(4, 0.75, 0.5), None, True),  # the first result
    (_record(4, 0.75, 0.5), _record(2, 0.50, 0.1), True),  # higher precision, whatever the loss
    (_record(4, 0.50, 0.1), _record(2, 0.75, 0.5), False),
    (_record(4, 0.75, 0.4), _record(2, 0.75, 0.5), True),  # tie: the lower loss
    (_record(4, 0.75, 0.6), _record(2, 0.75, 0.5), False),
    (_record(4, 0.75, 0.5), _record(2, 0.75, 0.5), False),  # tie on both: the earlier step stays
    (_record(2, 0.75, 0.5), _record(4, 0.75, 0.5), True),
    (_record(2, 0.75, 0.5), _record(2, 0.75, 0.5), False),  # the best evaluated again (a restarted evaluator)
    (_record(4, 0.25, 0.9, eval_data='train'), _record(2, 0.75, 0.5), True),  # other eval data: not comparable
    (_record(4, 0.25, 0.9, num_examples=2), _record(2, 0.75, 0.5), True),
    (_record(0, 1.00, 0.0), None, False),  # the untrained model (step 0) is never the best, not even the first
    (_record(0, 1.00, 0.0), _record(2, 0.25, 0.9), False),
])
def test_a_result_beats_the_best_by_precision_then_loss_then_the_earlier_step(record, best, beats):
    assert onu_best.beats(record, best) is beats


def _train_dir(tmp_path, steps=(2, 4)):
    """A folder of real checkpoints at steps, with a run_config.json; returns (folder, {step: prefix})."""
    train_dir = str(tmp_path / 'train')
    paths = {step: _checkpoint(train_dir, step) for step in steps}
    with open(onu_run_config.path_in(train_dir), 'w', encoding='utf-8') as f:
        json.dump({'model': 'small', 'image_size': 32}, f)
    return train_dir, paths


def test_the_best_is_a_checkpoint_folder_of_its_own_that_outlives_the_source(tmp_path):
    train_dir, paths = _train_dir(tmp_path)
    eval_dir = str(tmp_path / 'eval')
    os.makedirs(eval_dir)
    assert onu_best.read_best(eval_dir) is None
    kept = onu_best.keep(eval_dir, paths[2], _record(2, 0.75, 0.5), train_dir)
    best_dir = onu_best.best_dir(eval_dir)
    assert sorted(os.listdir(best_dir)) == sorted(['checkpoint', 'best.json', 'run_config.json'] + [
        os.path.basename(name) for name in tf.io.gfile.glob(paths[2] + '.*')])
    assert onu_best.read_best(eval_dir) == kept
    assert (kept['step'], kept['precision_at_1'], kept['loss'], kept['eval_data'], kept['num_examples']) == (
        2, 0.75, 0.5, 'val', 4)
    assert kept['source'] == os.path.abspath(paths[2]) and kept['checkpoint'] == 'model.ckpt-2'
    for name in tf.io.gfile.glob(paths[2] + '.*'):  # the source deleted, as --keep_checkpoint_max does
        os.remove(name)
    # Read as any --checkpoint_dir is: its state file names the copy, which reads back in full.
    assert tf.train.latest_checkpoint(best_dir) == os.path.join(best_dir, 'model.ckpt-2')
    assert onu_checkpoint.list_checkpoints(best_dir) == [os.path.join(best_dir, 'model.ckpt-2')]
    onu_checkpoint.check_readable(os.path.join(best_dir, 'model.ckpt-2'))
    assert onu_run_config.RunConfig.load(best_dir).model == 'small'
    # A new best replaces it whole: no file of step 2 is left.
    onu_best.keep(eval_dir, paths[4], _record(4, 1.0, 0.1), train_dir)
    assert tf.train.latest_checkpoint(best_dir) == os.path.join(best_dir, 'model.ckpt-4')
    assert not any(name.startswith('model.ckpt-2') for name in os.listdir(best_dir))
    assert sorted(os.listdir(eval_dir)) == ['best']


def test_a_deleted_checkpoint_leaves_the_previous_best_and_no_partial_copy(tmp_path):
    train_dir, paths = _train_dir(tmp_path)
    eval_dir = str(tmp_path / 'eval')
    onu_best.keep(eval_dir, paths[2], _record(2, 0.5, 0.5), train_dir)
    for gone in ('.index', '.data-00000-of-00001'):  # deleted by the trainer after it was evaluated
        os.remove(paths[4] + gone)
        with pytest.raises(onu_checkpoint.CheckpointGone, match=paths[4]):
            onu_best.keep(eval_dir, paths[4], _record(4, 0.75, 0.5), train_dir)
        assert sorted(os.listdir(eval_dir)) == ['best']
        assert onu_best.read_best(eval_dir)['step'] == 2
        _checkpoint(train_dir, 4)


def test_no_best_yet_or_an_unreadable_best_json_reads_as_none(tmp_path):
    eval_dir = str(tmp_path / 'eval')
    assert onu_best.read_best(eval_dir) is None  # the evaluator's first start: no eval_dir yet
    os.makedirs(onu_best.best_dir(eval_dir))
    for content in ('{"step": 4, "precision_at_1"', '[4]', '{"precision_at_1": 0.75}', '{"step": "4"}'):
        with open(os.path.join(onu_best.best_dir(eval_dir), onu_best.BEST_FILENAME), 'w', encoding='utf-8') as f:
            f.write(content)
        assert onu_best.read_best(eval_dir) is None, content


class Killed(BaseException):
    """The evaluator stopped dead (kill -9) at a file-system call: nothing after it runs, no handler catches it."""


@contextlib.contextmanager
def killed_at(monkeypatch, stop):
    """Stops the process (Killed) at the stop-th file-system change while it lasts (0: the first); yields the list
    of the calls made, by name."""
    calls = []

    def watched(name, call):
        def change(*args, **kwargs):
            calls.append(name)
            if len(calls) - 1 == stop:
                raise Killed(name)
            return call(*args, **kwargs)
        return change
    with monkeypatch.context() as patch:
        for module, names in ((os, ('makedirs', 'mkdir', 'rename', 'replace', 'remove', 'unlink', 'rmdir')),
                              (shutil, ('copy2', 'copyfile', 'rmtree')),
                              (onu_checkpoint, ('write_state',))):
            for name in names:
                patch.setattr(module, name, watched(name, getattr(module, name)))
        patch.setattr(onu_best, 'open', watched('open', open), raising=False)  # best.json
        yield calls


def test_an_evaluator_killed_anywhere_in_a_keep_leaves_a_whole_best_the_next_start_finds(tmp_path, monkeypatch):
    train_dir, paths = _train_dir(tmp_path)
    kept_before = str(tmp_path / 'before')
    onu_best.keep(kept_before, paths[2], _record(2, 0.5, 0.5), train_dir)
    found = []
    for stop in range(100):  # at each file-system change of keeping step 4, in turn, until one keep runs through
        eval_dir = str(tmp_path / f'eval-{stop}')
        shutil.copytree(kept_before, eval_dir)
        with killed_at(monkeypatch, stop) as calls:
            try:
                onu_best.keep(eval_dir, paths[4], _record(4, 0.75, 0.5), train_dir)
            except Killed:
                pass
        # The next start: best.json names a checkpoint that best/'s state file lists and that reads back in full.
        best = onu_best.read_best(eval_dir)
        best_dir = onu_best.best_dir(eval_dir)
        assert best is not None, (stop, calls)
        path = os.path.join(best_dir, best['checkpoint'])
        assert best['checkpoint'] == f'model.ckpt-{best["step"]}', (stop, calls)
        assert tf.train.latest_checkpoint(best_dir) == path, (stop, calls)
        onu_checkpoint.check_readable(path)
        assert sorted(os.listdir(eval_dir)) == ['best'], (stop, calls)
        found.append(best['step'])
        if len(calls) <= stop:
            break
    else:
        raise AssertionError(f'keep made more file-system changes than the test counts: {calls}')
    # The previous best until the new one is whole in place, then the new one; the last keep ran through.
    assert found == [2] * found.count(2) + [4] * found.count(4) and found.count(2) > 1 and found[-1] == 4, found
    assert {'copy2', 'rename', 'unlink'} <= set(calls)  # killed while copying, swapping and removing the old one
