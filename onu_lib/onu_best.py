"""The best checkpoint an evaluator has seen, kept in EVAL_DIR/best/: a checkpoint folder of its own.

    best = read_best(eval_dir)                  # best.json's record, or None before the first evaluation
    if beats(record, best):                     # record: the evaluator's results.jsonl entry
        best = keep(eval_dir, checkpoint_path, record, checkpoint_dir)   # CheckpointGone if it was deleted

best/ holds the checkpoint's files, a `checkpoint` state file, the training run's run_config.json and best.json, so
every tool that takes --checkpoint_dir reads it. A new best is copied beside it, then swapped in by two renames; an
evaluator stopped between them leaves the previous best as best.old, which the next read_best puts back.

A library module: explicit arguments only, no flags.
"""
import datetime
import glob
import json
import os
import shutil

from onu_lib import onu_checkpoint
from onu_lib import onu_run_config

BEST_DIRNAME = 'best'
BEST_FILENAME = 'best.json'
_NEW_PREFIX = 'best.new-'  # a copy in progress (its evaluator's pid after the dash)
_OLD_DIRNAME = 'best.old'  # the previous best while a new one is swapped in


def best_dir(eval_dir):
    """The folder of eval_dir's best checkpoint."""
    return os.path.join(eval_dir, BEST_DIRNAME)


def restore(eval_dir):
    """Finishes what an interrupted keep left in eval_dir: the previous best back in place, a partial copy removed."""
    best, old = best_dir(eval_dir), os.path.join(eval_dir, _OLD_DIRNAME)
    if os.path.isdir(old):
        if os.path.isdir(best):
            shutil.rmtree(old)  # the new best was swapped in; removing the old one was cut short
        else:
            os.rename(old, best)  # stopped between the two renames
    for name in os.listdir(eval_dir) if os.path.isdir(eval_dir) else ():
        if name.startswith(_NEW_PREFIX):
            shutil.rmtree(os.path.join(eval_dir, name), ignore_errors=True)


def read_best(eval_dir):
    """The record of eval_dir's best checkpoint (best.json), or None when there is none yet."""
    restore(eval_dir)
    try:
        with open(os.path.join(best_dir(eval_dir), BEST_FILENAME), encoding='utf-8') as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get('step'), int) else None


def same_eval_data(record, best):
    """True if two results were measured on the same examples (split and how many of it)."""
    return all(record.get(key) == best.get(key) for key in ('eval_data', 'num_examples'))

UNTRAINED_STEP = 0  # the trainer's first checkpoint, saved before any training step


def beats(record, best):
    """True if record is better than best: a higher precision @ 1 on the same eval data (ties: the lower loss, then
    the earlier step). Any trained result beats no best, and a best measured on other eval data; the untrained
    model (step 0, saved before the first training step) never does."""
    if record['step'] == UNTRAINED_STEP:
        return False
    if best is None or not same_eval_data(record, best):
        return True

    def rank(result):
        return -result['precision_at_1'], result['loss'], result['step']
    return rank(record) < rank(best)


def keep(eval_dir, checkpoint_path, record, checkpoint_dir):
    """Copies checkpoint_path's files and checkpoint_dir's run_config.json into eval_dir/best/ with best.json, in
    place of the previous best; returns best.json's record. CheckpointGone when the checkpoint's files are gone."""
    new = os.path.join(eval_dir, f'{_NEW_PREFIX}{os.getpid()}')
    shutil.rmtree(new, ignore_errors=True)
    os.makedirs(new)
    try:
        files = glob.glob(glob.escape(checkpoint_path) + '.*')
        if not any(name.endswith('.index') for name in files) or not any('.data-' in name for name in files):
            raise FileNotFoundError(checkpoint_path)
        for name in files:
            shutil.copy2(name, new)
    except FileNotFoundError:
        shutil.rmtree(new, ignore_errors=True)
        raise onu_checkpoint.CheckpointGone(checkpoint_path) from None
    run_config = onu_run_config.path_in(checkpoint_dir)
    if os.path.isfile(run_config):
        shutil.copy2(run_config, new)
    kept = os.path.join(new, os.path.basename(checkpoint_path))
    onu_checkpoint.write_state(new, [kept])
    best = {'step': record['step'], 'precision_at_1': record['precision_at_1'], 'loss': record['loss'],
            'eval_data': record['eval_data'], 'num_examples': record['num_examples'],
            'checkpoint': os.path.basename(checkpoint_path), 'source': os.path.abspath(checkpoint_path),
            'kept': datetime.datetime.now().isoformat(timespec='seconds')}
    with open(os.path.join(new, BEST_FILENAME), 'w', encoding='utf-8') as f:
        json.dump(best, f, indent=1)
    _swap_in(eval_dir, new)
    return best


def _swap_in(eval_dir, new):
    """Makes the folder new eval_dir's best/, the previous best set aside until it is in place."""
    best, old = best_dir(eval_dir), os.path.join(eval_dir, _OLD_DIRNAME)
    if os.path.isdir(best):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(best, old)
    os.rename(new, best)
    shutil.rmtree(old, ignore_errors=True)
