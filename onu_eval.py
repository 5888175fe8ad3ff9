"""Evaluates each checkpoint a training run writes (the CIFAR-10 tutorial's cifar10_eval.py role).

    python onu_train.py                   # one terminal
    python onu_eval.py                    # another: evaluates each new checkpoint of /tmp/onu_train into its eval/
    python onu_tensorboard.py --logdir /tmp/onu_train

Each checkpoint is evaluated once, with the moving averages of the weights that training kept, on every example
of the split exactly once. For each it prints `<time>: step N, precision @ 1 = 0.xxx`, writes TensorBoard summaries
at the checkpoint's global step (precision, loss, recall per class, confusion matrix, up to --max_mistakes
misclassified photos, PR curves, and eval/calibration/*: the expected calibration error before and after the
temperature an export would fit on these examples, the share its known threshold keeps (--known_recall) and precision
@ 1 on those, each measured out of fold: onu_known) and appends a JSON line to eval_dir/results.jsonl (with the
misclassified file names and `calibration`). On a terminal a progress bar shows the examples evaluated; in logs and pipes there is none.
The best checkpoint so far (precision @ 1 on the same eval data; ties: the lower loss, then the earlier step) is
copied into eval_dir/best/, a checkpoint folder of its own that outlives the trainer's --keep_checkpoint_max and
that onu_export.py --checkpoint_dir=eval_dir/best exports; `Best precision @ 1` is its TensorBoard scalar. With
--export_best each new best is also exported as a SavedModel version folder (TF Serving's layout) in --export_dir.
It stops by itself once the training run's final step (onu_train.py --max_steps) is evaluated,
after --timeout_secs seconds without a new checkpoint, or after one evaluation with --run_once.
Model, image size, data and class names come from the training run's run_config.json; flags given
on the command line override them.
"""
import contextlib
import dataclasses
import json
import os
import sys
import time
from datetime import datetime

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
from tqdm import tqdm

from onu_lib import onu_best
from onu_lib import onu_checkpoint
from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_eval_summaries
from onu_lib import onu_flags
from onu_lib import onu_hparams
from onu_lib import onu_known
import onu_input
import onu_model
from onu_lib import onu_precision
from onu_lib import onu_run_config
from onu_lib import onu_run_folder
from onu_lib import onu_serving

RESULTS_FILENAME = 'results.jsonl'
RECALL_TAG_PREFIX = 'eval/recall/'
CONFUSION_MATRIX_TAG = 'eval/confusion_matrix'
KNOWN_TAG_PREFIX = 'eval/calibration/'
KNOWN_FIGURES = ('ece_before', 'ece_after', 'val_known', 'precision_known')  # onu_known.Calibration.figures
DEVICES = ('cpu', 'gpu')
DEFAULT_MAX_MISTAKES = 16

FLAGS = flags.FLAGS


@dataclasses.dataclass
class EvalResult:
    """What one evaluation of one checkpoint found; confusion[true, predicted] counts examples."""
    checkpoint: str
    step: int
    class_names: tuple
    confusion: np.ndarray
    loss: float
    weights: str  # onu_checkpoint.WEIGHTS_AVERAGED or WEIGHTS_RAW
    predictions: 'Predictions'
    known: object = None  # onu_known.Calibration on these examples (None: a class has fewer than 2)

    @property
    def num_examples(self):
        """Returns how many examples were evaluated."""
        return int(self.confusion.sum())

    @property
    def precision_at_1(self):
        """Returns the fraction of examples whose most probable class is their label."""
        return float(np.trace(self.confusion)) / max(self.num_examples, 1)

    def recall(self):
        """Returns {class name: fraction of its examples predicted as it}, None for absent classes."""
        totals = self.confusion.sum(axis=1)
        return {name: float(self.confusion[i, i] / totals[i]) if totals[i] else None
                for i, name in enumerate(self.class_names)}


# ----------------------------------------------------------------------------------------------
# Evaluation

def eval_run_config(checkpoint_dir):
    """Returns (the training run's RunConfig with the model and data flags given here applied, the onu_dataset.DataDir
    of its data, described once)."""
    saved = onu_run_config.RunConfig.load(checkpoint_dir)
    if not saved and not FLAGS.model:
        raise onu_errors.DataError(
            f'{onu_run_config.path_in(checkpoint_dir)} not found, so the model is unknown: point '
            f'--checkpoint_dir at the --train_dir of onu_train.py, or give --model (and --image_size, '
            f'--data_dir, --data_format if training used others than the defaults)')
    run_config = saved or onu_run_config.RunConfig(
        model=FLAGS.model, image_size=FLAGS.image_size,
        moving_average_decay=onu_model.DEFAULT_MOVING_AVERAGE_DECAY)
    overrides = {name: onu_flags.value_or_saved(name, saved)
                 for name in ('model', 'data_dir', 'data_format', 'image_size', 'labels_offset', 'validation_percent')}
    run_config = run_config.replace(**overrides)
    data = onu_dataset.describe(run_config.data_dir, run_config.validation_percent, run_config.labels_offset)
    return run_config.replace(image_size=run_config.image_size or onu_model.model_spec(run_config.model).image_size,
                              data_format=run_config.data_format or data.default_format()), data


def check_same_split(checkpoint_dir):
    """DataError if --validation_percent asks for another split of class folders than the training run made."""
    saved = onu_run_config.RunConfig.load(checkpoint_dir)
    if saved and saved.validation_percent is not None and FLAGS['validation_percent'].present and (
            FLAGS.validation_percent != saved.validation_percent):
        raise onu_errors.DataError(
            f'--validation_percent={FLAGS.validation_percent:g} but the training run held out '
            f'{saved.validation_percent:g}% ({onu_run_config.path_in(checkpoint_dir)}): another split would evaluate '
            f'photos it trained on; leave --validation_percent out')


def check_class_names(run_config, info):
    """Returns the class names the model was trained on; DataError if the data labels others."""
    trained = run_config.class_names or tuple(info.class_names)
    if trained != tuple(info.class_names):
        raise onu_errors.DataError(
            f'{info.data_dir}: classes {", ".join(info.class_names)} but the model was trained on '
            f'{", ".join(trained)}; evaluate on data with the training classes (--data_dir)')
    return trained


@dataclasses.dataclass
class Predictions:
    """What the model said of each evaluated example, in input order, and the photos of its worst mistakes."""
    filenames: list
    labels: np.ndarray         # [N] true class indices
    probabilities: np.ndarray  # [N, num_classes] softmax
    mistakes: list             # onu_eval_summaries.Mistake: the most confident ones, at most max_mistakes
    logits: np.ndarray = None    # [N, num_classes]
    features: np.ndarray = None  # [N, D]: onu_model.known_features

    def misclassified(self):
        """Returns the file names of every misclassified example, in input order."""
        return onu_eval_summaries.misclassified(self.filenames, self.labels, self.probabilities)


def run_predictions(session, fetches, limit, max_mistakes):
    """Runs the eval graph until the end of its input (or limit examples); returns (Predictions, loss sum)."""
    filenames, labels, probabilities, kept_images, chosen, loss_sum = [], [], [], {}, [], 0.0
    logits, features = [], []
    with tqdm(total=limit, unit='photo', desc='evaluating', leave=False, disable=not onu_cli.show_progress()) as bar:
        while len(labels) < limit:
            try:
                batch = session.run(fetches)
            except tf.errors.OutOfRangeError:
                break
            keep = int(min(len(batch['labels']), limit - len(labels)))
            first = len(labels)
            filenames += [onu_eval_summaries.text(name) for name in batch['filenames'][:keep]]
            labels += batch['labels'][:keep].tolist()
            probabilities += list(batch['probabilities'][:keep])
            logits += list(batch['logits'][:keep])
            features += list(batch['features'][:keep])
            loss_sum += float(np.sum(batch['losses'][:keep], dtype=np.float64))
            # The worst mistakes so far are among those kept and this batch's: only these are ranked again.
            chosen = worst_mistakes(sorted(chosen) + list(range(first, first + keep)),
                                    filenames, labels, probabilities, max_mistakes)
            kept_images = {index: kept_images[index] if index < first else batch['images'][index - first]
                           for index in chosen}
            bar.update(keep)
    probabilities = np.array(probabilities, np.float32).reshape(len(labels), -1)
    labels = np.array(labels, np.int64)
    mistakes = [onu_eval_summaries.Mistake.from_prediction(filenames[index], model_input_photo(kept_images[index]),
                                                           labels[index], probabilities[index])
                for index in chosen]
    return Predictions(filenames, labels, probabilities, mistakes, np.array(logits, np.float32).reshape(len(labels), -1),
                       np.array(features, np.float32).reshape(len(labels), -1)), loss_sum


def worst_mistakes(candidates, filenames, labels, probabilities, max_mistakes):
    """Returns the indices of the max_mistakes most confident mistakes among candidates (indices in input order)."""
    if not candidates:
        return []
    ranked = onu_eval_summaries.select_mistakes([filenames[index] for index in candidates],
                                                [labels[index] for index in candidates],
                                                np.array([probabilities[index] for index in candidates]),
                                                max_mistakes)
    return [candidates[position] for position in ranked]


def model_input_photo(image):
    """Returns the model's input image ([-1, 1] float) as the uint8 photo it was made from (resized)."""
    return np.clip(np.round((np.asarray(image, np.float32) + 1.0) * 127.5), 0, 255).astype(np.uint8)


def confusion_of(labels, probabilities, num_classes):
    """Returns the confusion matrix [true, predicted] of the examples' labels and class probabilities."""
    pairs = labels * num_classes + np.argmax(probabilities, axis=1)
    return np.bincount(pairs, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def evaluate(checkpoint_path, run_config, info, batch_size=32, num_examples=None,
             allow_raw_weights=False, device='cpu', compute_dtype='float32', max_mistakes=DEFAULT_MAX_MISTAKES,
             known_recall=onu_known.DEFAULT_KNOWN_RECALL):
    """Evaluates one checkpoint on the examples of info, the eval split (each once); returns its EvalResult, with
    the temperature and known threshold an export would fit on them (onu_known.calibrate, known_recall).

    Raises onu_checkpoint.CheckpointGone or DamagedCheckpoint when the checkpoint is deleted or damaged.
    """
    class_names = check_class_names(run_config, info)
    limit = min(num_examples or info.num_examples, info.num_examples)
    with tf.Graph().as_default():
        images, labels, filenames = onu_input.next_batch(
            onu_input.eval_batches(info, batch_size, run_config.image_size, with_filenames=True))
        logits, end_points = onu_model.inference(images, len(class_names), run_config.model,
                                                 is_training=False, create_aux_logits=False)
        columns, blocks = onu_model.known_features(end_points, run_config.model)
        fetches = {'labels': labels, 'filenames': filenames, 'logits': tf.cast(logits, tf.float32),
                   'features': tf.concat(columns, axis=1),
                   'probabilities': tf.nn.softmax(tf.cast(logits, tf.float32)),
                   'losses': tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)}
        if max_mistakes > 0:  # the photos of the mistakes (a copy of every batch out of the session)
            fetches['images'] = images
        session_config = onu_precision.set_precision_options(
            onu_precision.session_config(hide_gpus=device == 'cpu'), compute_dtype)
        with tf.compat.v1.Session(config=session_config) as session:
            try:
                step = onu_checkpoint.checkpoint_step(checkpoint_path)
            except onu_checkpoint.READ_ERRORS as e:
                raise onu_checkpoint.read_error(checkpoint_path, e) from None
            weights = onu_checkpoint.restore(session, checkpoint_path, run_config.moving_average_decay,
                                             allow_raw_weights)
            with onu_dataset.read_errors_as_data_error(info):
                predictions, loss_sum = run_predictions(session, fetches, limit, max_mistakes)
    confusion = confusion_of(predictions.labels, predictions.probabilities, len(class_names))
    try:
        known = onu_known.calibrate(predictions.logits, predictions.features, predictions.labels, blocks, known_recall)
    except ValueError:  # fewer than 2 photos of a class: nothing to fit
        known = None
    return EvalResult(checkpoint=checkpoint_path, step=step, class_names=class_names, confusion=confusion,
                      loss=loss_sum / max(confusion.sum(), 1), weights=weights, predictions=predictions, known=known)


# ----------------------------------------------------------------------------------------------
# Reporting

def confusion_markdown(result):
    """Returns the confusion matrix as a Markdown table: a row per true class, a column per prediction."""
    names = result.class_names
    lines = ['| true \\ predicted | ' + ' | '.join(names) + ' |',
             '|---|' + '---:|' * len(names)]
    lines += [f'| **{name}** | ' + ' | '.join(str(count) for count in row) + ' |'
              for name, row in zip(names, result.confusion)]
    return '\n'.join(lines)


def result_summary(result, best_precision):
    """Returns the Summary proto of an EvalResult, with best_precision: the best precision @ 1 so far, or None."""
    value = tf.compat.v1.Summary.Value
    values = [value(tag=onu_hparams.PRECISION_TAG, simple_value=result.precision_at_1),
              value(tag=onu_hparams.LOSS_TAG, simple_value=result.loss)]
    if best_precision is not None:  # None: no best yet (only the untrained model evaluated)
        values.append(value(tag=onu_hparams.BEST_PRECISION_TAG, simple_value=best_precision))
    values += [value(tag=RECALL_TAG_PREFIX + name, simple_value=recall)
               for name, recall in result.recall().items() if recall is not None]
    values += [value(tag=KNOWN_TAG_PREFIX + name, simple_value=number)
               for name, number in known_figures(result.known).items() if number is not None]
    text_plugin = tf.compat.v1.SummaryMetadata(
        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name='text'))
    values.append(value(tag=CONFUSION_MATRIX_TAG, metadata=text_plugin,
                        tensor=tf.compat.v1.make_tensor_proto(confusion_markdown(result))))
    predictions = result.predictions  # the pictures: heatmap, mistakes grid, PR curves
    values += onu_eval_summaries.eval_summary_values(result.confusion, result.class_names, predictions.labels,
                                                     predictions.probabilities, predictions.mistakes)
    return tf.compat.v1.Summary(value=values)


def known_figures(calibration):
    """The figures of a calibration eval reports ({} without one): expected calibration error before and after the
    temperature, the share of the photos known (each scored by a fit to the others) and precision @ 1 on those."""
    if calibration is None:
        return {}
    return {name: calibration.figures[name] for name in KNOWN_FIGURES}


def result_record(result, run_config, eval_data):
    """Returns the results.jsonl entry of an EvalResult."""
    return {
        'time': datetime.now().isoformat(timespec='seconds'),
        'step': result.step,
        'checkpoint': result.checkpoint,
        'eval_data': eval_data,
        'num_examples': result.num_examples,
        'precision_at_1': result.precision_at_1,
        'loss': result.loss,
        'per_class_recall': result.recall(),
        'confusion_matrix': result.confusion.tolist(),
        'class_names': list(result.class_names),
        'weights': result.weights,
        'misclassified': result.predictions.misclassified(),
        'calibration': result.known and result.known.summary(),
        'model': run_config.model,
        'image_size': run_config.image_size,
        'data_dir': run_config.data_dir,
        'data_format': run_config.data_format,
    }


def report(result, record, writer, eval_dir, best_precision):
    """Prints the precision line, writes the summaries and appends record to eval_dir/results.jsonl."""
    raw = ', raw weights' if result.weights == onu_checkpoint.WEIGHTS_RAW else ''
    print(f'{datetime.now()}: step {result.step}, precision @ 1 = {result.precision_at_1:.3f} '
          f'(loss {result.loss:.4f}, {result.num_examples} {record["eval_data"]} examples{raw})',
          flush=True)
    writer.add_summary(result_summary(result, best_precision), result.step)
    writer.flush()
    append_line(os.path.join(eval_dir, RESULTS_FILENAME), json.dumps(record, ensure_ascii=False))


def append_line(path, line):
    """Appends line to the file at path whole, or not at all: a write that fails is cut off again, and what a
    crash left of a line is cut off first, so that the new line does not join it."""
    size = 0
    if os.path.exists(path):
        with open(path, 'rb') as f:
            size = f.read().rfind(b'\n') + 1  # the end of the last whole line
        if size != os.path.getsize(path):
            os.truncate(path, size)
    try:
        with open(path, 'a', encoding='utf-8') as f:
            f.write(line + '\n')
    except OSError:
        with contextlib.suppress(OSError):
            os.truncate(path, size)
        raise


# ----------------------------------------------------------------------------------------------
# The polling loop

def use_device(device):
    """Hides the GPUs for device cpu; lets TensorFlow take GPU memory only as needed for device gpu."""
    gpus = onu_precision.visible_gpus()
    if device == 'gpu' and not gpus:
        print('--device=gpu but TensorFlow sees no GPU: evaluating on the CPU.', flush=True)
    try:
        if device == 'cpu':
            tf.config.set_visible_devices([], 'GPU')
        else:
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        pass  # TensorFlow is already initialised in this process: its devices stay as they are


def final_step(checkpoint_dir):
    """Returns the step at which the training run stops (its saved --max_steps), or None."""
    run_config = onu_run_config.RunConfig.load(checkpoint_dir)
    return run_config and run_config.max_steps


def describe(run_config, info, num_examples, eval_dir, checkpoint_dir):
    """Prints what is evaluated, on which data (info: the eval split's), and where the results go."""
    eval_data = info.split
    count = f'all {info.num_examples}'
    if num_examples and num_examples < info.num_examples:
        count = f'the first {num_examples} of the {info.num_examples}'
    elif num_examples and num_examples > info.num_examples:
        print(f'--num_examples={num_examples} but the {eval_data} split has {info.num_examples}: '
              f'evaluating all of them.', flush=True)
    size = run_config.image_size
    print(f'Evaluating {run_config.model} at {size}x{size} on {count} {eval_data} examples '
          f'({run_config.data_format}) of {run_config.data_dir}; results in {eval_dir}',
          flush=True)
    caution = onu_hparams.row_caution(checkpoint_dir, eval_dir)
    if caution:
        print(caution, flush=True)


def wait_for_checkpoints(checkpoint_dir, done, interval_secs, timeout_secs):
    """Returns the checkpoints not in done, oldest first, once there are any; [] after timeout_secs."""
    started = time.monotonic()
    announced = False
    while True:
        pending = [path for path in onu_checkpoint.list_checkpoints(checkpoint_dir) if path not in done]
        waited = time.monotonic() - started
        if pending or (timeout_secs is not None and waited >= timeout_secs):
            return pending
        if not announced:
            what = 'a new checkpoint' if done else 'the first checkpoint'
            print(f'Waiting for {what} in {checkpoint_dir} (checking every {interval_secs:g} s).',
                  flush=True)
            announced = True
        pause = interval_secs if timeout_secs is None else min(interval_secs, timeout_secs - waited)
        time.sleep(max(pause, 0.0))


def reported_results(eval_dir, eval_data):
    """Returns {global step: results.jsonl record} of what eval_dir already holds for eval_data."""
    path = os.path.join(eval_dir, RESULTS_FILENAME)
    records = {}
    if not os.path.isfile(path):
        return records
    with open(path, encoding='utf-8') as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash: that checkpoint is evaluated again
            if record.get('eval_data') == eval_data and isinstance(record.get('step'), int):
                records[record['step']] = record
    return records


def keep_best(eval_dir, checkpoint_path, record, checkpoint_dir, best):
    """Keeps checkpoint_path, whose record beats best, in eval_dir/best/; returns the record best/ holds after it."""
    where = onu_best.best_dir(eval_dir)
    was = 'the first'
    if best and onu_best.same_eval_data(record, best):
        was = f'before: step {best["step"]}, {best["precision_at_1"]:.3f}'
    try:
        kept = onu_best.keep(eval_dir, checkpoint_path, record, checkpoint_dir)
    except onu_checkpoint.CheckpointGone:
        still = f'{where} keeps step {best["step"]}' if best else f'{where} stays empty'
        print(f'Step {record["step"]} is the best so far (precision @ 1 = {record["precision_at_1"]:.3f}), but '
              f'{checkpoint_path} was deleted before it could be kept (the trainer keeps only the newest '
              f'--keep_checkpoint_max): {still}.', flush=True)
        return best
    print(f'New best: step {kept["step"]}, precision @ 1 = {kept["precision_at_1"]:.3f} ({was}); kept in {where}',
          flush=True)
    return kept


def evaluate_checkpoints(writer, precision):
    """Evaluates each new checkpoint of --checkpoint_dir once, until the final step, --timeout_secs or --run_once."""
    checkpoint_dir, eval_data = FLAGS.checkpoint_dir, FLAGS.eval_data
    check_same_split(checkpoint_dir)
    run_config = info = None
    reported = reported_results(FLAGS.eval_dir, eval_data)
    best = onu_best.read_best(FLAGS.eval_dir)
    results_path = os.path.join(FLAGS.eval_dir, RESULTS_FILENAME)
    # Evaluated, reported by an earlier run, damaged, or passed over after a deletion.
    done = {path for path in onu_checkpoint.list_checkpoints(checkpoint_dir)
            if onu_checkpoint.listed_step(path) in reported}
    if done and not FLAGS.run_once:
        print(f'{len(done)} checkpoint(s) of {checkpoint_dir} already in {results_path}: not evaluating '
              f'them again.', flush=True)
    if not FLAGS.run_once and final_step(checkpoint_dir) in reported:
        export = ''
        if FLAGS.export_best and best:  # nothing new to keep: the best kept so far, exported by hand
            command = onu_errors.shell_command('onu_export.py', checkpoint_dir=onu_best.best_dir(FLAGS.eval_dir))
            export = f' The best kept, step {best["step"]}, exports with {command}'
        print(f'Step {final_step(checkpoint_dir)}, the training run\'s final step, is already evaluated: done.{export}',
              flush=True)
        return
    while True:
        if FLAGS.run_once:
            latest = onu_checkpoint.list_checkpoints(checkpoint_dir)[-1:]
            if latest and latest[0] in done and onu_checkpoint.listed_step(latest[0]) in reported:
                record = reported[onu_checkpoint.listed_step(latest[0])]
                print(f'Step {record["step"]} is already in {results_path} (precision @ 1 = '
                      f'{record["precision_at_1"]:.3f}): not evaluating it again.', flush=True)
                return
            pending = [path for path in onu_checkpoint.list_checkpoints(checkpoint_dir) if path not in done][-1:]
        else:
            pending = wait_for_checkpoints(checkpoint_dir, done, FLAGS.eval_interval_secs, FLAGS.timeout_secs)
        if not pending and not done:
            after = '' if FLAGS.run_once else f' after waiting {FLAGS.timeout_secs:g} s'
            raise onu_checkpoint.no_checkpoint_error(checkpoint_dir, 'point --checkpoint_dir at the training run',
                                                     after)
        if not pending:
            if not FLAGS.run_once:
                print(f'No new checkpoint in {checkpoint_dir} for {FLAGS.timeout_secs:g} s: stopping.', flush=True)
            return
        if run_config is None:
            run_config, data = eval_run_config(checkpoint_dir)
            info = run_config.split_info(eval_data, data=data)
            describe(run_config, info, FLAGS.num_examples, FLAGS.eval_dir, checkpoint_dir)
        path = pending[0]
        try:
            result = evaluate(path, run_config, info, FLAGS.batch_size, FLAGS.num_examples,
                              FLAGS.allow_raw_weights, FLAGS.device, precision.compute_dtype, FLAGS.max_mistakes,
                              FLAGS.known_recall)
        except onu_checkpoint.CheckpointGone:
            newer = [p for p in onu_checkpoint.list_checkpoints(checkpoint_dir) if p not in done and p != path]
            done.update([path] + newer[:-1])
            print(f'{path} was deleted while being read (the trainer keeps only the newest '
                  f'--keep_checkpoint_max): skipping to the newest checkpoint.', flush=True)
            continue
        except onu_checkpoint.DamagedCheckpoint as e:
            done.add(path)
            print(f'skipping {e}', flush=True)
            continue
        done.add(path)
        record = result_record(result, run_config, eval_data)
        is_best = onu_best.beats(record, best)
        # The best precision seen, even when the trainer deletes that checkpoint before it can be kept.
        best_precision = (record if is_best else best or {}).get('precision_at_1')
        report(result, record, writer, FLAGS.eval_dir, best_precision)
        if record['step'] == onu_best.UNTRAINED_STEP:
            print(f'Step {record["step"]} is the untrained model: evaluated, never kept as the best.', flush=True)
        if is_best:
            kept = keep_best(FLAGS.eval_dir, path, record, checkpoint_dir, best)
            if FLAGS.export_best and kept is not best:
                export_dir = FLAGS.export_dir or onu_serving.default_export_dir(FLAGS.eval_dir)
                onu_serving.export_saved_model(os.path.join(onu_best.best_dir(FLAGS.eval_dir), kept['checkpoint']),
                                               run_config, export_dir, FLAGS.allow_raw_weights,
                                               known_recall=FLAGS.known_recall)
            best = kept
        if FLAGS.run_once:
            return
        last_step = final_step(checkpoint_dir)
        if last_step is not None and result.step >= last_step:
            print(f'Step {result.step} is the training run\'s final step (--max_steps={last_step}): '
                  f'done.', flush=True)
            return


def define_flags():
    """Declares this script's flags (the shared model and data flags come from onu_flags)."""
    onu_flags.define_model_flags()
    flags.adopt_module_key_flags(onu_flags)
    flags.DEFINE_string('eval_dir', None,
                        f'Where TensorBoard event files and {RESULTS_FILENAME} (a JSON line per evaluated checkpoint) '
                        f'go; default: <checkpoint_dir>/{onu_hparams.EVAL_GROUP}, where the figures join the training '
                        f'run\'s row of the HParams tab.')
    onu_flags.define_checkpoint_dir_flag(
        'The training run to evaluate (onu_train.py --train_dir): checkpoints and run_config.json.')
    flags.DEFINE_enum('eval_data', 'val', onu_dataset.SPLITS, 'Split to evaluate.')
    flags.DEFINE_float('eval_interval_secs', 300, 'How often to look for a new checkpoint, in seconds.',
                       lower_bound=0.1)
    flags.DEFINE_integer('num_examples', None,
                         'Evaluate only the first N examples of the split (default: all of them); '
                         'val is read in class order, so a few give a quick check, not a fair sample.',
                         lower_bound=1)
    flags.DEFINE_boolean('run_once', False, 'Evaluate the latest checkpoint once, then exit.')
    flags.DEFINE_boolean('export_best', False,
                         'Export each new best checkpoint (the one eval_dir/best/ keeps) as a SavedModel version '
                         'folder <global_step>/ in --export_dir, the layout TF Serving watches.')
    flags.DEFINE_string('export_dir', None,
                        'Where --export_best puts its version folders; default: <eval_dir>/export.')
    onu_flags.define_known_recall_flag()
    flags.DEFINE_integer('max_mistakes', DEFAULT_MAX_MISTAKES,
                         'Misclassified photos shown in TensorBoard (eval/mistakes), the most confident '
                         'mistakes first; results.jsonl lists them all (0: no grid).', lower_bound=0)
    flags.DEFINE_float('timeout_secs', None, 'Stop after this many seconds without a new checkpoint '
                       '(default: wait until the training run\'s final step).', lower_bound=0)
    onu_flags.define_allow_raw_weights_flag(
        'Evaluate the raw weights when a checkpoint has no moving averages of them.')
    flags.DEFINE_enum('device', 'cpu', DEVICES,
                      'cpu leaves the GPU to a trainer running beside; gpu takes GPU memory as needed.')
    onu_flags.define_precision_flag(
        'float32', 'float32 (default), mixed (bfloat16 on a CPU with AMX/AVX512_BF16, float16 on a GPU of '
        'compute capability 7.0+) or auto (mixed where there is such a fast path). Any precision reads '
        'checkpoints of any other.')
    onu_cli.define_deprecated_alias('timeout', 'timeout_secs')


def evaluate_from_flags():
    """Evaluates the checkpoints the flags name, writing summaries and results to --eval_dir (one evaluator each)."""
    FLAGS.eval_dir = FLAGS.eval_dir or onu_hparams.row_eval_dir(FLAGS.checkpoint_dir)
    onu_run_folder.hold_folder(FLAGS.eval_dir, 'evaluation', 'eval_dir')
    use_device(FLAGS.device)
    precision = onu_precision.resolve_precision(FLAGS.precision, use_gpus=FLAGS.device == 'gpu')
    with onu_run_folder.stop_on_write_failure(FLAGS.eval_dir, 'evaluation'):
        with tf.Graph().as_default():  # a v1 FileWriter is created in graph mode
            writer = tf.compat.v1.summary.FileWriter(FLAGS.eval_dir)
        try:
            evaluate_checkpoints(writer, precision)
        except KeyboardInterrupt:
            print('Stopped.', file=sys.stderr)
            return 130
        finally:
            writer.close()
    return 0


def main(argv):
    return onu_cli.run_script(evaluate_from_flags, argv, failures=(onu_run_folder.WriteFailed,))


if __name__ == '__main__':
    define_flags()
    app.run(main)
