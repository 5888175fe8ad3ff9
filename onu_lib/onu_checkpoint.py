"""Everything about the checkpoints of a training run: which there are, which are readable, restoring.

    paths = list_checkpoints(train_dir)                  # model.ckpt-<step> prefixes, oldest first
    path = find_checkpoint(train_dir)                    # the newest, checked readable (or a clear error)
    weights = restore(session, path, moving_average_decay)   # moving averages, or raw with allow_raw_weights
    resume_from = prepare_resume(train_dir)              # what training restarts from, damage set aside

A run folder may be moved or copied: checkpoints are found by their files inside the folder given, never by the
absolute paths of TensorFlow's `checkpoint` state file, which is rewritten relative to its folder (the training Saver
keeps it so), so a copied run never reads or writes the original's files. A damaged checkpoint is never deleted:
training moves it aside (model.ckpt-<step>.damaged.*) and resumes from the newest readable one; eval skips it; export
and predict name it and the readable alternative.

A library module: explicit arguments only, no flags.
"""
import glob
import os
import re

from google.protobuf import text_format
import tensorflow as tf

from onu_lib import onu_errors
import onu_model

CHECKPOINT_BASENAME = 'model.ckpt'  # MonitoredTrainingSession's: model.ckpt-<global step>
DAMAGED_MARK = 'damaged'
STATE_FILENAME = 'checkpoint'       # TensorFlow's checkpoint state file
WEIGHTS_AVERAGED = 'moving_averages'
WEIGHTS_RAW = 'raw'
_INDEX = re.compile(re.escape(CHECKPOINT_BASENAME) + r'-(\d+)\.index$')
_ANY_FILE = re.compile(re.escape(CHECKPOINT_BASENAME) + r'-(\d+)\.(?:index|data-\d+-of-\d+)$')
# What TensorFlow raises for a damaged checkpoint: DataLossError/NotFoundError (OpError), a
# ValueError for an unparsable index, an IndexError ("Read less bytes than requested") for a data
# file cut short.
READ_ERRORS = (tf.errors.OpError, ValueError, IndexError, RuntimeError)


class DamagedCheckpoint(onu_errors.UserError):
    """A checkpoint whose files are incomplete or unreadable."""

    def __init__(self, path, reason):
        super().__init__(f'{path}: damaged checkpoint ({reason})')
        self.path = path
        self.reason = reason


class CheckpointGone(Exception):
    """The checkpoint's files disappeared while it was read (the trainer keeps only the newest few)."""


def one_line(error):
    """Returns the first non-empty line of an exception's message (TensorFlow's can be long)."""
    message = getattr(error, 'message', None) or str(error) or type(error).__name__
    return next((line.strip() for line in message.splitlines() if line.strip()), type(error).__name__)


# ----------------------------------------------------------------------------------------------
# Finding checkpoints

def list_checkpoints(checkpoint_dir, include_incomplete=False):
    """Returns the model.ckpt-<step> prefixes in checkpoint_dir with an .index (Saver writes it last), oldest first;
    include_incomplete: also those with only data files (an interrupted save, or a lost index)."""
    try:
        names = os.listdir(checkpoint_dir)
    except OSError:
        return []
    pattern = _ANY_FILE if include_incomplete else _INDEX
    steps = sorted({int(match.group(1)) for match in map(pattern.match, names) if match})
    return [os.path.join(checkpoint_dir, f'{CHECKPOINT_BASENAME}-{step}') for step in steps]


def listed_step(path):
    """Returns the step in a model.ckpt-<step> prefix's name, or None."""
    match = _INDEX.match(os.path.basename(path) + '.index')
    return int(match.group(1)) if match else None


def check_readable(path):
    """Raises DamagedCheckpoint unless every tensor of the checkpoint prefix path reads back in full."""
    if not os.path.isfile(path + '.index'):
        raise DamagedCheckpoint(path, 'its .index file is missing')
    if not glob.glob(glob.escape(path) + '.data-*'):
        raise DamagedCheckpoint(path, 'its .data file is missing')
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except READ_ERRORS as e:
        raise DamagedCheckpoint(path, one_line(e)) from None


def newest_readable(checkpoint_dir, before=None):
    """Returns (the newest readable checkpoint, older than before if given, or None, [DamagedCheckpoint of newer
    ones])."""
    damaged = []
    paths = list_checkpoints(checkpoint_dir, include_incomplete=True)
    if before is not None:
        paths = [path for path in paths if (listed_step(path) or 0) < (listed_step(before) or 0)]
    for path in reversed(paths):
        try:
            check_readable(path)
            return path, damaged
        except DamagedCheckpoint as e:
            damaged.append(e)
    return None, damaged


def no_checkpoint_error(checkpoint_dir, or_else, waited=''):
    """The DataError for a checkpoint_dir without any checkpoint: train first (the command), or or_else."""
    command = onu_errors.shell_command('onu_train.py', train_dir=checkpoint_dir)
    return onu_errors.DataError(f'{checkpoint_dir}: no checkpoint{waited}; train first ({command}) or {or_else}')


def find_checkpoint(checkpoint_dir, checkpoint_path=None, use_instead=None):
    """Returns checkpoint_path, or the newest checkpoint in checkpoint_dir, checked readable; DataError when there is
    none or it is damaged, naming the newest readable alternative and use_instead(alternative), how to use it."""
    path = checkpoint_path or (list_checkpoints(checkpoint_dir) or [None])[-1]
    if not path:
        raise no_checkpoint_error(checkpoint_dir, 'pass --checkpoint_path')
    if checkpoint_path and not listed_step(path) and not os.path.isfile(path + '.index'):
        raise onu_errors.DataError(f'{path}: not a checkpoint prefix (no {path}.index); pass the '
                                    f'prefix of an existing one, e.g. {checkpoint_dir}/model.ckpt-1000')
    try:
        check_readable(path)
    except DamagedCheckpoint as e:
        alternative, _ = newest_readable(os.path.dirname(path) or '.', before=path)
        if not alternative:
            raise onu_errors.DataError(f'{e}; no older checkpoint there is readable; train again') from None
        advice = (use_instead or (lambda p: f'pass {onu_errors.shell_flag("checkpoint_path", p)}'))(alternative)
        raise onu_errors.DataError(f'{e}; the newest readable one is {alternative}: {advice}') from None
    return path


def checkpoint_step(path):
    """Returns the global step stored in a checkpoint."""
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor('global_step'):
        raise onu_errors.DataError(f'{path}: no global_step in this checkpoint; use a checkpoint '
                                    f'written by onu_train.py')
    return int(reader.get_tensor('global_step'))


# ----------------------------------------------------------------------------------------------
# The state file, and what training resumes from

def write_state(checkpoint_dir, paths):
    """Rewrites checkpoint_dir's state file to list paths (newest last) relative to the folder (if it lists others)."""
    checkpoint_dir = os.path.abspath(checkpoint_dir)  # relative paths would be made relative twice
    names = [os.path.basename(path) for path in paths]
    state = text_format.MessageToString(tf.compat.v1.train.generate_checkpoint_state_proto(
        checkpoint_dir, names[-1], all_model_checkpoint_paths=list(names)))  # it changes the list it is given
    try:
        with open(os.path.join(checkpoint_dir, STATE_FILENAME), encoding='utf-8') as f:
            if f.read() == state:
                return  # a finished run started again writes nothing
    except (OSError, UnicodeDecodeError):
        pass
    tf.compat.v1.train.update_checkpoint_state(checkpoint_dir, names[-1], all_model_checkpoint_paths=list(names))


def set_aside(damaged_path):
    """Renames a damaged checkpoint's files to <prefix>.damaged.<suffix>; returns the new prefix."""
    new_prefix = f'{damaged_path}.{DAMAGED_MARK}'
    for name in glob.glob(glob.escape(damaged_path) + '.*'):
        suffix = name[len(damaged_path) + 1:]
        if suffix.startswith(DAMAGED_MARK + '.') or suffix == 'tempstate':
            continue
        os.replace(name, f'{new_prefix}.{suffix}')
    return new_prefix


def prepare_resume(train_dir, warn=print):
    """Makes train_dir resumable from its newest readable checkpoint, newer damaged ones set aside with a warning each
    and the state file rewritten relative to train_dir; returns that prefix or None."""
    resume_from, damaged = newest_readable(train_dir)
    for error in reversed(damaged):
        moved = set_aside(error.path)
        warn(f'warning: {error}; resuming from {resume_from or "the start"} instead (moved aside as '
             f'{os.path.basename(moved)}.*, not deleted)')
    readable = [path for path in list_checkpoints(train_dir) if resume_from and
                listed_step(path) <= listed_step(resume_from)]
    if readable:
        write_state(train_dir, readable)
    elif os.path.isfile(os.path.join(train_dir, STATE_FILENAME)):
        # Nothing of this folder's own is readable: the state file must not lead anywhere else.
        os.replace(os.path.join(train_dir, STATE_FILENAME),
                   os.path.join(train_dir, f'{STATE_FILENAME}.{DAMAGED_MARK}'))
    return resume_from


def training_saver(max_to_keep):
    """Returns the Saver training checkpoints with: its state file holds paths relative to the folder."""
    return tf.compat.v1.train.Saver(max_to_keep=max_to_keep, save_relative_paths=True)


def check_resumable(train_dir, run_config, saved):
    """Fails clearly when train_dir holds a run (saved, a RunConfig) that run_config cannot resume."""
    if not saved or not list_checkpoints(train_dir):
        return
    # The classes, how stored labels map to them, and which photos are held out for val must stay as they were.
    for key in ('model', 'image_size', 'class_names', 'labels_offset', 'validation_percent'):
        if getattr(saved, key) != getattr(run_config, key):
            raise onu_errors.DataError(
                f'{train_dir} holds a run with {key}={getattr(saved, key)!r}, not '
                f'{getattr(run_config, key)!r}; pass the same flags to resume, or a new --train_dir to '
                f'start over')


# ----------------------------------------------------------------------------------------------
# Restoring

def variables_to_restore(moving_average_decay=onu_model.DEFAULT_MOVING_AVERAGE_DECAY, checkpoint_path=None):
    """Returns {checkpoint name: variable} for a Saver that loads moving averages (none: moving_average_decay 0 or
    None) into the model; with checkpoint_path, a variable whose average the checkpoint lacks loads its own value.
    A training graph's own shadow variables are left out: their variables load from them.
    """
    averaged = onu_model.averaged_variables() if moving_average_decay else []
    shadow_names = {onu_model.moving_average_name(v) for v in averaged}
    in_checkpoint = None
    if checkpoint_path:
        in_checkpoint = set(tf.train.load_checkpoint(checkpoint_path).get_variable_to_shape_map())
    restore = {}
    for var in tf.compat.v1.global_variables():
        if var.op.name in shadow_names:
            continue
        shadow = onu_model.moving_average_name(var)
        use_shadow = shadow in shadow_names and (in_checkpoint is None or shadow in in_checkpoint)
        restore[shadow if use_shadow else var.op.name] = var
    return restore


def check_shapes(path, shapes, name, var, fix):
    """Raises DataError when checkpoint tensor name (of shapes) is missing or shaped unlike var; fix: what to do."""
    if name not in shapes:
        raise onu_errors.DataError(f'{path}: {name} is not in this checkpoint, so {fix}')
    if list(shapes[name]) != var.shape.as_list():
        raise onu_errors.DataError(f'{path}: {var.op.name} has shape {shapes[name]} but the model needs '
                                    f'{var.shape.as_list()}; {fix}')


def weights_to_restore(checkpoint_path, moving_average_decay, allow_raw_weights=False):
    """Returns ({checkpoint name: model variable of the default graph}, WEIGHTS_AVERAGED or WEIGHTS_RAW); DataError
    when a variable is missing or shaped otherwise, or (unless allow_raw_weights) its moving average is missing."""
    restore = variables_to_restore(moving_average_decay, checkpoint_path)
    shapes = tf.train.load_checkpoint(checkpoint_path).get_variable_to_shape_map()
    for name, var in restore.items():
        check_shapes(checkpoint_path, shapes, name, var,
                     'it was not written for this run configuration; use the --checkpoint_dir that '
                     'trained it')
    if not moving_average_decay:
        return restore, WEIGHTS_RAW
    averaged = {v.op.name for v in onu_model.averaged_variables()}
    raw = sorted(name for name in restore if name in averaged)
    if raw and not allow_raw_weights:
        raise onu_errors.DataError(
            f'{checkpoint_path}: no moving average of {raw[0]} (and {len(raw) - 1} more variables); '
            f'pass --allow_raw_weights to use the raw weights instead')
    return restore, WEIGHTS_RAW if raw else WEIGHTS_AVERAGED


def restore(session, checkpoint_path, moving_average_decay, allow_raw_weights=False):
    """Restores the model of the session's graph from checkpoint_path; returns which weights it used. CheckpointGone
    when its files vanish while read, DamagedCheckpoint when they are damaged."""
    try:
        with session.graph.as_default():
            restore_map, weights = weights_to_restore(checkpoint_path, moving_average_decay, allow_raw_weights)
            tf.compat.v1.train.Saver(restore_map).restore(session, checkpoint_path)
    except READ_ERRORS as e:
        raise read_error(checkpoint_path, e) from None
    return weights


def read_error(path, error):
    """Returns the exception for a checkpoint that failed to read: CheckpointGone without its .index (Saver deletes
    that first, for max_to_keep), else DamagedCheckpoint."""
    if not os.path.isfile(path + '.index'):
        return CheckpointGone(path)
    return DamagedCheckpoint(path, one_line(error))


def warm_start_saver(checkpoint_path, exclude_scopes, report=print):
    """Returns (saver, path) restoring the model variables found in checkpoint_path (a file prefix or folder);
    report(line) hears which variables are excluded or missing from the checkpoint."""
    path = checkpoint_path
    if os.path.isdir(checkpoint_path):
        # The folder's own newest model.ckpt-N, not the state file's absolute path (a copied folder);
        # the state file only for checkpoints named otherwise.
        path = (list_checkpoints(checkpoint_path) or [None])[-1] or tf.train.latest_checkpoint(checkpoint_path)
        if not path:
            raise onu_errors.DataError(f'{checkpoint_path}: no checkpoint in this folder; '
                                        f'give a checkpoint file prefix to --fine_tune_checkpoint')
    try:
        shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    except READ_ERRORS as e:
        raise onu_errors.DataError(f'{checkpoint_path}: not a readable checkpoint '
                                    f'({one_line(e)}); check --fine_tune_checkpoint') from None
    exclude_scopes = onu_model.scope_list(exclude_scopes)
    restore_map, excluded, missing = {}, [], []
    for var in tf.compat.v1.model_variables() or tf.compat.v1.trainable_variables():
        name = var.op.name
        if onu_model.in_scopes(name, exclude_scopes) or name in exclude_scopes:
            excluded.append(name)
        elif name not in shapes:
            missing.append(name)
        else:
            check_shapes(path, shapes, name, var, 'add its scope to --checkpoint_exclude_scopes')
            restore_map[name] = var
    report(f'Fine-tuning from {path}: {len(restore_map)} variables restored, {len(excluded)} excluded, '
           f'{len(missing)} not in the checkpoint.')
    for name in excluded:
        report(f'  excluded (freshly initialised): {name}')
    for name in missing:
        report(f'  not in the checkpoint (freshly initialised): {name}')
    if not restore_map:
        raise onu_errors.DataError(f'{path}: no model variable matches this checkpoint; '
                                    f'check --model and --fine_tune_checkpoint')
    return tf.compat.v1.train.Saver(restore_map), path
