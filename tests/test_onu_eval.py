"""Tests of onu_eval.py: real checkpoints of tiny runs, checked against an independent computation."""
import contextlib
import glob
import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import (TINY_IMAGE_SIZE, TINY_RUN_STEPS, copy_train_dir, mount, pasted, printed_command,
                      run_on_a_terminal, run_script,
                      start_script, script_tested_models)

from onu_lib import onu_errors
from onu_lib import onu_sample_data
from onu_lib import onu_best
from onu_lib import onu_checkpoint
from onu_lib import onu_dataset
import onu_eval
from onu_lib import onu_eval_summaries
from onu_lib import onu_hparams
from onu_lib import onu_known
import onu_input
import onu_model
from onu_lib import onu_run_config
from onu_lib import onu_serving

TIMEOUT_SECS = 180
IMAGE_SIZE = 32
MAX_STEPS = 6
CLASS_NAMES = ['F603', 'F663N']
VAL_PER_CLASS = 5
TRAIN_PER_CLASS = 8
SHADOW_SUFFIX = '/ExponentialMovingAverage'

# Runs onu_eval.main with the trainer deleting the checkpoint named by the first argument right
# after the evaluator has read its global step, before the weights are restored. A script file:
# run_script runs it in the repo, which it imports from.
RACE_DRIVER = '''
import os
import sys
sys.path.insert(0, os.getcwd())
from absl import app
import tensorflow as tf
import onu_eval
from onu_lib import onu_checkpoint

doomed = sys.argv.pop(1)
read_step = onu_checkpoint.checkpoint_step

def step_then_deleted_by_the_trainer(path):
    step = read_step(path)
    if path == doomed:
        for name in tf.io.gfile.glob(path + '.*'):
            tf.io.gfile.remove(name)
    return step

onu_checkpoint.checkpoint_step = step_then_deleted_by_the_trainer
onu_eval.define_flags()
app.run(onu_eval.main)
'''


def run_eval(*args):
    """Runs onu_eval.py with args; returns the CompletedProcess (text output)."""
    return run_script('onu_eval.py', *args, timeout=TIMEOUT_SECS)


def read_results(eval_dir):
    """Returns the entries of eval_dir/results.jsonl."""
    with open(os.path.join(eval_dir, onu_eval.RESULTS_FILENAME), encoding='utf-8') as f:
        return [json.loads(line) for line in f]


def checkpoint_steps(train_dir):
    """Returns the global steps of the checkpoints train_dir's state file lists, oldest first."""
    state = tf.train.get_checkpoint_state(train_dir)
    return [int(tf.train.load_checkpoint(path).get_tensor('global_step'))
            for path in state.all_model_checkpoint_paths]


def event_summaries(eval_dir):
    """Returns ({(tag, step): simple value or text}, {tag: plugin name}) from eval_dir's event files."""
    found, plugins = {}, {}
    for path in glob.glob(os.path.join(eval_dir, 'events.out.tfevents*')):
        for record in tf.compat.v1.io.tf_record_iterator(path):
            event = tf.compat.v1.Event.FromString(record)
            for value in event.summary.value:
                # FileWriter keeps a tag's plugin metadata on its first occurrence only.
                plugins.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
                kind = value.WhichOneof('value')
                if kind == 'simple_value':
                    found[value.tag, event.step] = value.simple_value
                elif kind == 'tensor' and value.tensor.string_val:  # text
                    found[value.tag, event.step] = value.tensor.string_val[0].decode()
                else:  # an image, or a PR curve's tensor
                    found[value.tag, event.step] = kind
    return found, plugins


# ----------------------------------------------------------------------------------------------
# The independent computation: photos decoded with PIL, weights loaded by hand, metrics in numpy.

def reference_logits(checkpoint_path, data_dir, image_size, shadows, split='val', model_name='small'):
    """Returns (labels, logits) of the split's photos, each variable loaded from its shadow or raw value."""
    reader = tf.train.load_checkpoint(checkpoint_path)
    photos = [(label, path) for label, name in enumerate(CLASS_NAMES)
              for path in sorted(glob.glob(os.path.join(data_dir, split, name, '*')))]
    with tf.Graph().as_default():
        image = tf.compat.v1.placeholder(tf.uint8, [None, None, 3])
        model_input = onu_input.preprocess_for_eval(image, image_size)[tf.newaxis]
        logits, _ = onu_model.inference(model_input, len(CLASS_NAMES), model_name, is_training=False,
                                        create_aux_logits=False)
        with tf.compat.v1.Session() as session:
            for var in tf.compat.v1.global_variables():
                var.load(reader.get_tensor(var.op.name + (SHADOW_SUFFIX if shadows else '')), session)
            outputs = [session.run(logits, {image: np.asarray(Image.open(path).convert('RGB'))})[0]
                       for _, path in photos]
    return np.array([label for label, _ in photos]), np.array(outputs, np.float64)


def reference_metrics(labels, logits):
    """Returns (precision at 1, mean cross-entropy, confusion matrix) computed in numpy."""
    predictions = logits.argmax(axis=1)
    confusion = np.zeros([len(CLASS_NAMES)] * 2, np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    top = logits.max(axis=1, keepdims=True)
    log_sum_exp = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    loss = np.mean(log_sum_exp - logits[np.arange(len(labels)), labels])
    return float(np.mean(predictions == labels)), float(loss), confusion


def assert_matches(result, reference):
    """Asserts an EvalResult has the (precision, loss, confusion) of a reference computation."""
    precision, loss, confusion = reference
    np.testing.assert_array_equal(result.confusion, confusion)
    assert result.precision_at_1 == precision
    assert result.loss == pytest.approx(loss, rel=1e-4)


# ----------------------------------------------------------------------------------------------
# Fixtures

@pytest.fixture(scope='module')
def polled_run(tmp_path_factory):
    """The evaluator started on an empty train_dir (exporting each new best), then a 6-step training run beside it.

    Returns (data_dir, train_dir, eval_dir, the evaluator's CompletedProcess-like result).
    """
    root = tmp_path_factory.mktemp('polled')
    data_dir, train_dir, eval_dir = (str(root / name) for name in ('data', 'train', 'eval'))
    onu_sample_data.generate_dataset(data_dir, TRAIN_PER_CLASS, VAL_PER_CLASS, (96, 72), seed=0, processes=1)
    evaluator = start_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--batch_size=4',
                             '--eval_interval_secs=0.2', '--timeout_secs=120', '--export_best',
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        trainer = run_script('onu_train.py', f'--data_dir={data_dir}', f'--train_dir={train_dir}',
                             f'--max_steps={MAX_STEPS}', '--save_checkpoint_steps=2', f'--image_size={IMAGE_SIZE}',
                             '--batch_size=4', '--seed=0', timeout=TIMEOUT_SECS)
        assert trainer.returncode == 0, trainer.stderr
        stdout, stderr = evaluator.communicate(timeout=TIMEOUT_SECS)
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    return data_dir, train_dir, eval_dir, subprocess.CompletedProcess(
        evaluator.args, evaluator.returncode, stdout, stderr)


@contextlib.contextmanager
def small_model_session(step):
    """A session of the small model at IMAGE_SIZE for CLASS_NAMES, with moving averages and its global step at step.

    Yields (session, the averaged model variables, the ExponentialMovingAverage)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        onu_model.inference(tf.zeros([1, IMAGE_SIZE, IMAGE_SIZE, 3]), len(CLASS_NAMES), 'small',
                            is_training=False)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        model_variables = onu_model.averaged_variables()
        moving_average = tf.compat.v1.train.ExponentialMovingAverage(0.999)
        moving_average.apply(model_variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            global_step.load(step, session)
            yield session, model_variables, moving_average


@pytest.fixture(scope='module')
def handmade_checkpoints(tmp_path_factory):
    """Two checkpoints (step 7) of the small model at 32x32 with the same raw weights.

    Returns {'averaged': path whose moving averages differ clearly from the raw weights,
             'raw_only': path without moving averages}.
    """
    root = tmp_path_factory.mktemp('handmade')
    rng = np.random.default_rng(0)
    with small_model_session(7) as (session, model_variables, moving_average):
        for var in model_variables:
            initial = session.run(var)
            for target in (var, moving_average.average(var)):
                if 'moving_variance' in var.op.name:
                    target.load(rng.uniform(0.5, 2.0, initial.shape), session)
                else:
                    target.load(initial + rng.normal(0.0, 0.3, initial.shape), session)
        paths = {'averaged': str(root / 'averaged' / 'model.ckpt-7'),
                 'raw_only': str(root / 'raw_only' / 'model.ckpt-7')}
        tf.compat.v1.train.Saver().save(session, paths['averaged'])
        global_step = tf.compat.v1.train.get_global_step()
        tf.compat.v1.train.Saver(model_variables + [global_step]).save(session, paths['raw_only'])
    return paths


def one_class_checkpoint(train_dir, step, logits_biases):
    """Writes train_dir/model.ckpt-<step> of the small model whose logits are logits_biases whatever the photo (the
    Logits layer's weights 0, moving averages as the weights): it predicts one class, as sure as the biases say."""
    with small_model_session(step) as (session, model_variables, moving_average):
        for var in model_variables:
            if var.op.name.startswith(f'{onu_model.SMALL_SCOPE}/Logits/'):
                value = logits_biases if 'biases' in var.op.name else np.zeros(var.shape)
                for target in (var, moving_average.average(var)):
                    target.load(value, session)
        tf.compat.v1.train.Saver().save(session, os.path.join(train_dir, f'model.ckpt-{step}'))


def handmade_run_config(data_dir, data_format='encoded'):
    """Returns the run configuration of the handmade checkpoints evaluated on data_dir."""
    return onu_run_config.RunConfig(model='small', image_size=IMAGE_SIZE, data_dir=data_dir, data_format=data_format,
                                    class_names=CLASS_NAMES, moving_average_decay=onu_model.DEFAULT_MOVING_AVERAGE_DECAY)


# ----------------------------------------------------------------------------------------------
# Evaluating one checkpoint

def test_eval_uses_the_moving_averages_not_the_raw_weights(handmade_checkpoints, tiny_data_dir):
    path = handmade_checkpoints['averaged']
    result = onu_eval.evaluate(path, handmade_run_config(tiny_data_dir), handmade_run_config(tiny_data_dir).split_info('val'), batch_size=3)
    with_shadows = reference_metrics(*reference_logits(path, tiny_data_dir, IMAGE_SIZE, shadows=True))
    with_raw = reference_metrics(*reference_logits(path, tiny_data_dir, IMAGE_SIZE, shadows=False))
    assert abs(with_raw[1] - with_shadows[1]) > 0.05  # the two weight sets really give different losses
    assert result.step == 7
    assert result.weights == onu_checkpoint.WEIGHTS_AVERAGED
    assert_matches(result, with_shadows)


def test_checkpoint_without_moving_averages_is_a_clear_error_unless_raw_weights_are_allowed(
        handmade_checkpoints, tiny_data_dir):
    path = handmade_checkpoints['raw_only']
    config = handmade_run_config(tiny_data_dir)
    with pytest.raises(onu_errors.DataError) as error:
        onu_eval.evaluate(path, config, config.split_info('val'), batch_size=3)
    message = str(error.value)
    assert path in message and '--allow_raw_weights' in message
    assert 'not found in checkpoint' not in message and '\n' not in message
    result = onu_eval.evaluate(path, config, config.split_info('val'), batch_size=3, allow_raw_weights=True)
    assert result.weights == onu_checkpoint.WEIGHTS_RAW
    assert_matches(result, reference_metrics(*reference_logits(path, tiny_data_dir, IMAGE_SIZE, shadows=False)))


@pytest.mark.parametrize('data_format', onu_dataset.DATA_FORMATS)
def test_every_example_is_counted_once_including_the_partial_final_batch(
        handmade_checkpoints, tiny_data_dir, data_format):
    info = onu_dataset.describe(tiny_data_dir).split('val', data_format)
    per_class = [len(os.listdir(os.path.join(tiny_data_dir, 'val', name))) for name in CLASS_NAMES]
    assert info.num_examples == sum(per_class) and info.num_examples % 3  # 3 does not divide it
    config = handmade_run_config(tiny_data_dir, data_format)
    path = handmade_checkpoints['averaged']
    result = onu_eval.evaluate(path, config, config.split_info('val'), batch_size=3)
    assert result.confusion.sum(axis=1).tolist() == per_class


def test_num_examples_evaluates_the_first_examples_and_at_most_the_split(handmade_checkpoints, tiny_data_dir):
    config = handmade_run_config(tiny_data_dir)
    path = handmade_checkpoints['averaged']
    first_two = onu_eval.evaluate(path, config, config.split_info('val'), batch_size=3, num_examples=2)
    assert first_two.confusion.sum(axis=1).tolist() == [2, 0]  # val is read in class order
    everything = onu_eval.evaluate(path, config, config.split_info('val'), batch_size=3, num_examples=99)
    assert everything.num_examples == onu_dataset.describe(tiny_data_dir).split('val', 'encoded').num_examples


def test_num_examples_that_cut_a_batch_average_the_loss_over_those_examples_only(polled_run):
    data_dir, train_dir, eval_dir, _ = polled_run
    path = read_results(eval_dir)[-1]['checkpoint']  # a few steps in: every example has a sizeable loss
    labels, logits = reference_logits(path, data_dir, IMAGE_SIZE, shadows=True)
    run_config = onu_run_config.RunConfig.load(train_dir)
    for num_examples in (3, 6):  # batches of 4: the first one cut, then the second
        result = onu_eval.evaluate(path, run_config, run_config.split_info('val'), batch_size=4, num_examples=num_examples)
        assert result.num_examples == num_examples
        assert_matches(result, reference_metrics(labels[:num_examples], logits[:num_examples]))


@pytest.mark.parametrize('model_name', script_tested_models())
def test_every_model_evaluates_as_a_numpy_computation_with_its_moving_averages(tiny_run_of, model_name):
    run = tiny_run_of(model_name)
    path = onu_checkpoint.list_checkpoints(run.train_dir)[-1]
    result = onu_eval.evaluate(path, run.config, run.config.split_info('val'), batch_size=3)
    assert result.weights == onu_checkpoint.WEIGHTS_AVERAGED
    assert result.num_examples == len(CLASS_NAMES) * 4  # tiny_run's 4 val photos per class
    labels, logits = reference_logits(path, run.data_dir, run.config.image_size, shadows=True, model_name=model_name)
    assert_matches(result, reference_metrics(labels, logits))
    # The calibration figures are this evaluation's: its logits' calibration error before the temperature.
    assert result.known.figures['ece_before'] == pytest.approx(
        onu_known.expected_calibration_error(onu_known.softmax(logits), labels), abs=1e-4)
    assert result.known.figures['val_examples'] == 8 and result.known.figures['val_known'] >= 0.95


def test_data_with_other_classes_than_the_training_run_is_a_clear_error(handmade_checkpoints, tiny_data_dir):
    config = handmade_run_config(tiny_data_dir).replace(class_names=['F603', 'F670L'])
    with pytest.raises(onu_errors.DataError, match='trained on F603, F670L'):
        onu_eval.evaluate(handmade_checkpoints['averaged'], config, config.split_info('val'))


# ----------------------------------------------------------------------------------------------
# Polling beside a training run

def test_polling_evaluates_each_checkpoint_once_and_stops_at_the_final_step(polled_run):
    _, train_dir, eval_dir, evaluator = polled_run
    assert evaluator.returncode == 0, evaluator.stderr
    assert 'Waiting for the first checkpoint in ' + train_dir in evaluator.stdout
    assert f"Step {MAX_STEPS} is the training run's final step" in evaluator.stdout
    steps = [entry['step'] for entry in read_results(eval_dir)]
    assert steps == checkpoint_steps(train_dir) == [0, 2, 4, 6]
    printed = [line for line in evaluator.stdout.splitlines()
               if ', precision @ 1 = ' in line and not line.startswith('New best: ')]
    assert [int(line.split('step ')[1].split(',')[0]) for line in printed] == steps


def test_results_file_has_a_line_per_checkpoint_counting_each_example_once(polled_run):
    data_dir, train_dir, eval_dir, evaluator = polled_run
    for entry in read_results(eval_dir):
        confusion = np.array(entry['confusion_matrix'])
        assert entry['num_examples'] == confusion.sum() == len(CLASS_NAMES) * VAL_PER_CLASS
        assert confusion.sum(axis=1).tolist() == [VAL_PER_CLASS] * len(CLASS_NAMES)
        assert entry['precision_at_1'] == pytest.approx(np.trace(confusion) / confusion.sum())
        assert entry['per_class_recall'] == {
            name: pytest.approx(confusion[i, i] / VAL_PER_CLASS) for i, name in enumerate(CLASS_NAMES)}
        assert entry['checkpoint'] == os.path.join(train_dir, f'model.ckpt-{entry["step"]}')
        assert (entry['eval_data'], entry['weights'], entry['model'], entry['image_size'], entry['data_dir']) == (
            'val', onu_checkpoint.WEIGHTS_AVERAGED, 'small', IMAGE_SIZE, data_dir)
        assert np.isfinite(entry['loss']) and entry['loss'] > 0
        assert f'step {entry["step"]}, precision @ 1 = {entry["precision_at_1"]:.3f}' in evaluator.stdout


def test_precision_equals_a_numpy_computation_with_the_shadow_values(polled_run):
    data_dir, train_dir, eval_dir, _ = polled_run
    final = read_results(eval_dir)[-1]
    precision, loss, confusion = reference_metrics(
        *reference_logits(final['checkpoint'], data_dir, IMAGE_SIZE, shadows=True))
    assert final['precision_at_1'] == precision
    assert final['confusion_matrix'] == confusion.tolist()
    assert final['loss'] == pytest.approx(loss, rel=1e-4)


def test_summaries_are_written_at_each_checkpoints_global_step(polled_run):
    _, _, eval_dir, _ = polled_run
    summaries, plugins = event_summaries(eval_dir)
    assert plugins[onu_eval.CONFUSION_MATRIX_TAG] == 'text'
    assert plugins['pr_curves/F603'] == plugins['pr_curves/F663N'] == 'pr_curves'
    for entry in read_results(eval_dir):
        step = entry['step']
        assert summaries[onu_hparams.PRECISION_TAG, step] == pytest.approx(entry['precision_at_1'])
        best_so_far = best_of([earlier for earlier in read_results(eval_dir) if earlier['step'] <= step])
        if best_so_far is None:  # only the untrained model so far: no best to show
            assert (onu_hparams.BEST_PRECISION_TAG, step) not in summaries and step == 0
        else:
            assert summaries[onu_hparams.BEST_PRECISION_TAG, step] == pytest.approx(best_so_far['precision_at_1'])
        assert summaries[onu_hparams.LOSS_TAG, step] == pytest.approx(entry['loss'])
        for name, recall in entry['per_class_recall'].items():
            assert summaries[onu_eval.RECALL_TAG_PREFIX + name, step] == pytest.approx(recall)
        table = summaries[onu_eval.CONFUSION_MATRIX_TAG, step]
        for name, row in zip(CLASS_NAMES, entry['confusion_matrix']):
            assert f'| **{name}** | {row[0]} | {row[1]} |' in table
        assert summaries['eval/confusion_matrix_image', step] == 'image'
        calibration = entry['calibration']  # expected calibration error before and after the temperature, ...
        assert calibration['known_recall'] == 0.95 and calibration['score'] == 'layer_distance'
        assert 0 <= calibration['ece_before'] <= 1 and 0 <= calibration['ece_after'] <= 1
        assert calibration['val_known'] >= 0.95 and calibration['temperature'] > 0
        for name in onu_eval.KNOWN_FIGURES:
            assert summaries[onu_eval.KNOWN_TAG_PREFIX + name, step] == pytest.approx(calibration[name])
        assert (summaries.get(('eval/mistakes', step)) == 'image') == bool(entry['misclassified'])


def best_of(records):
    """The results.jsonl record the evaluator keeps: the highest precision, then the lowest loss, then the earliest;
    never step 0, the untrained model (None when only it was evaluated)."""
    trained = [record for record in records if record['step'] > 0]
    return min(trained, key=lambda record: (-record['precision_at_1'], record['loss'], record['step']), default=None)


def test_the_best_checkpoint_is_kept_and_evaluates_and_exports_without_the_training_run(polled_run, tmp_path):
    _, train_dir, eval_dir, evaluator = polled_run
    records = read_results(eval_dir)
    best = best_of(records)
    kept = json.load(open(os.path.join(eval_dir, 'best', 'best.json')))
    assert (kept['step'], kept['precision_at_1'], kept['loss'], kept['source']) == (
        best['step'], best['precision_at_1'], best['loss'], best['checkpoint'])
    lines = evaluator.stdout.splitlines()
    news = [line for line in lines if line.startswith('New best: ')]
    assert records[0]['step'] == 0 and 'Step 0 is the untrained model: evaluated, never kept as the best.' in lines
    bests = sorted({best_of(records[:count + 1])['step'] for count in range(len(records)) if records[count]['step']})
    assert 0 not in bests
    assert len(news) == len(bests)
    assert news[-1].startswith(f'New best: step {best["step"]}, precision @ 1 = {best["precision_at_1"]:.3f} (')
    for index, line in enumerate(lines):  # each right after its step's result line
        if line.startswith('New best: step '):
            step = line.split()[3].rstrip(',')
            assert f': step {step}, precision @ 1 = ' in lines[index - 1], lines[index - 1:index + 1]
    # --export_best: a SavedModel version per new best, the newest version the best (what TF Serving serves).
    assert [step for step, _ in onu_serving.version_dirs(os.path.join(eval_dir, 'export'))] == bests
    exported = onu_run_config.RunConfig.load(os.path.join(eval_dir, 'export', str(best['step']),
                                                          onu_serving.METADATA_SUBDIR))
    assert exported.export['checkpoint_path'] == os.path.join(eval_dir, 'best', f'model.ckpt-{best["step"]}')
    # Asked again once all is evaluated, --export_best says how the best exports by hand.
    again = run_eval(f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--export_best')
    assert again.returncode == 0, again.stderr[-3000:]
    assert f'already evaluated: done. The best kept, step {best["step"]}, exports with ' in again.stdout
    assert pasted(printed_command(again.stdout)) == ['onu_export.py', f'--checkpoint_dir={eval_dir}/best']
    # The best folder alone, its training run gone (as --keep_checkpoint_max deletes checkpoints).
    best_dir = str(tmp_path / 'best')
    shutil.copytree(os.path.join(eval_dir, 'best'), best_dir)
    again = run_script('onu_eval.py', f'--checkpoint_dir={best_dir}', '--run_once', f'--eval_dir={tmp_path / "e"}',
                       '--batch_size=4', timeout=TIMEOUT_SECS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f'step {best["step"]}, precision @ 1 = {best["precision_at_1"]:.3f} ' in again.stdout
    exported = run_script('onu_export.py', f'--checkpoint_dir={best_dir}', timeout=TIMEOUT_SECS)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert 'export' not in os.listdir(best_dir)  # beside best/, never in it: a new best swaps best/ whole
    assert os.listdir(tmp_path / 'export') == [str(best['step'])]  # TF Serving's version: the best's step
    assert os.path.isfile(tmp_path / 'export' / str(best['step']) / 'saved_model.pb')


def test_a_worse_checkpoint_never_replaces_the_best_without_export_best(make_tiny_dataset, tmp_path):
    data_dir = make_tiny_dataset(train_per_class=1, val_per_class=2)
    os.remove(sorted(glob.glob(os.path.join(data_dir, 'val', CLASS_NAMES[1], '*')))[0])  # val: 2 F603, 1 F663N
    train_dir, eval_dir = str(tmp_path / 'train'), str(tmp_path / 'eval')
    # Each predicts one class: precision is that class's share of val, 1/3 or 2/3. Step 4 is the best; step 6, later
    # and worse, is as precise as step 2 with a lower loss (less sure of F663N, which 2 of 3 photos are not).
    biases = {2: [0.0, 1.0], 4: [0.7, 0.0], 6: [0.0, 0.2]}
    for step, logits_biases in biases.items():
        one_class_checkpoint(train_dir, step, logits_biases)
    onu_run_config.RunConfig(model='small', image_size=IMAGE_SIZE, class_names=CLASS_NAMES, data_dir=data_dir,
                             data_format='images', max_steps=6,
                             moving_average_decay=onu_model.DEFAULT_MOVING_AVERAGE_DECAY).save(train_dir)
    result = run_eval(f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--max_mistakes=0',
                      '--eval_interval_secs=0.2', '--timeout_secs=60')
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_results(eval_dir)
    assert [(record['step'], record['precision_at_1']) for record in records] == [
        (2, pytest.approx(1 / 3)), (4, pytest.approx(2 / 3)), (6, pytest.approx(1 / 3))]
    assert records[2]['loss'] < records[0]['loss']
    # best/ holds step 4: not the later, worse step 6, nor the last to beat the first.
    best, best_dir = onu_best.read_best(eval_dir), onu_best.best_dir(eval_dir)
    assert (best['step'], best['precision_at_1'], best['loss']) == (4, records[1]['precision_at_1'], records[1]['loss'])
    assert tf.train.latest_checkpoint(best_dir) == os.path.join(best_dir, 'model.ckpt-4')
    kept = tf.train.load_checkpoint(os.path.join(best_dir, 'model.ckpt-4'))
    np.testing.assert_array_equal(kept.get_tensor(f'{onu_model.SMALL_SCOPE}/Logits/biases'), np.float32(biases[4]))
    assert 'export' not in os.listdir(eval_dir)  # no --export_best: nothing exported


def test_by_default_the_figures_go_into_the_run_where_its_hparams_row_finds_them(tiny_run, tmp_path):
    copy_dir = copy_train_dir(tiny_run, tmp_path, exports=False)
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={copy_dir}', '--run_once', timeout=TIMEOUT_SECS)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f'results in {copy_dir}/eval' in evaluated.stdout and 'HParams tab' not in evaluated.stdout
    assert [record['step'] for record in read_results(os.path.join(copy_dir, 'eval'))] == [TINY_RUN_STEPS]


def test_a_restarted_evaluator_keeps_the_best_an_earlier_run_kept(tiny_run, tmp_path):
    copy_dir, eval_dir = copy_train_dir(tiny_run, tmp_path), str(tmp_path / 'eval')
    # An earlier evaluator's best: step 2 at precision 1 and loss 0, which no later result can beat.
    earlier = {'step': 2, 'precision_at_1': 1.0, 'loss': 0.0, 'eval_data': 'val',
               'num_examples': onu_dataset.describe(tiny_run.data_dir).split('val', 'images').num_examples}
    onu_best.keep(eval_dir, os.path.join(copy_dir, 'model.ckpt-2'), earlier, copy_dir)
    again = run_script('onu_eval.py', f'--checkpoint_dir={copy_dir}', f'--eval_dir={eval_dir}', '--run_once',
                       timeout=TIMEOUT_SECS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f'step {TINY_RUN_STEPS}, precision @ 1 = ' in again.stdout and 'New best' not in again.stdout
    # An eval folder outside the run: its figures cannot reach the run's HParams row, and the evaluator says so.
    assert (f'HParams tab: these figures join the row of {copy_dir} only with --eval_dir={copy_dir}/eval; from '
            f'{eval_dir} they show as a run of their own.\n') in again.stdout
    assert onu_best.read_best(eval_dir)['step'] == 2
    summaries, _ = event_summaries(eval_dir)
    assert summaries[onu_hparams.BEST_PRECISION_TAG, TINY_RUN_STEPS] == 1.0


def test_checkpoint_deleted_while_read_is_skipped_for_the_newest(tiny_run, tmp_path):
    copy_dir, eval_dir = copy_train_dir(tiny_run, tmp_path), str(tmp_path / 'eval')
    doomed = os.path.join(copy_dir, 'model.ckpt-0')
    driver = tmp_path / 'race_driver.py'
    driver.write_text(RACE_DRIVER)
    result = run_script(str(driver), doomed, f'--checkpoint_dir={copy_dir}', f'--eval_dir={eval_dir}',
                        '--eval_interval_secs=0.2', '--timeout_secs=60', timeout=TIMEOUT_SECS)
    assert result.returncode == 0, result.stderr
    assert 'Traceback' not in result.stderr
    notes = [line for line in result.stdout.splitlines() if 'was deleted while being read' in line]
    assert len(notes) == 1 and notes[0].startswith(doomed) and 'skipping to the newest' in notes[0]
    assert [(entry['step'], entry['checkpoint']) for entry in read_results(eval_dir)] == [
        (12, os.path.join(copy_dir, 'model.ckpt-12'))]  # the shared run's final step


def test_a_results_line_that_cannot_be_written_whole_is_cut_back_and_evaluated_again(tmp_path):
    """A full disk mid-line leaves results.jsonl as it was; a line a crash cut short counts as not reported."""
    eval_dir = str(tmp_path / 'eval')
    mount(eval_dir, '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs')
    try:
        path = os.path.join(eval_dir, onu_eval.RESULTS_FILENAME)
        for step in (0, 2):
            onu_eval.append_line(path, json.dumps({'step': step, 'eval_data': 'val', 'precision_at_1': 0.5}))
        with open(path, 'rb') as f:
            whole = f.read()
        with open(os.path.join(eval_dir, 'filler'), 'wb') as f:  # something else fills the disk: 1 KB left
            f.write(b'\0' * (shutil.disk_usage(eval_dir).free - 1024))
        long_line = json.dumps({'step': 4, 'eval_data': 'val', 'misclassified': ['val/F603/x.jpg'] * 2000})
        with pytest.raises(OSError):
            onu_eval.append_line(path, long_line)
        with open(path, 'rb') as f:
            assert f.read() == whole  # cut back to its last whole line
        assert sorted(onu_eval.reported_results(eval_dir, 'val')) == [0, 2]
        os.remove(os.path.join(eval_dir, 'filler'))
        with open(path, 'a', encoding='utf-8') as f:  # an evaluator killed while writing step 4's line
            f.write(long_line[:len(long_line) // 2])
        assert sorted(onu_eval.reported_results(eval_dir, 'val')) == [0, 2]  # step 4 is evaluated again
        onu_eval.append_line(path, json.dumps({'step': 4, 'eval_data': 'val', 'precision_at_1': 0.75}))
        assert onu_eval.reported_results(eval_dir, 'val')[4]['precision_at_1'] == 0.75  # on a line of its own
        with open(path, 'rb') as f:
            assert f.read().count(b'\n') == 3  # what the crash left of a line is gone
    finally:
        subprocess.run(['umount', eval_dir], check=True)


# ----------------------------------------------------------------------------------------------
# No checkpoint, no run configuration

def test_no_checkpoint_waits_with_a_message_then_times_out(tmp_path):
    checkpoint_dir = str(tmp_path / 'not_yet')
    started = time.monotonic()
    result = run_eval(f'--checkpoint_dir={checkpoint_dir}', f'--eval_dir={tmp_path / "eval"}',
                      '--eval_interval_secs=0.2', '--timeout=1.5')  # the old spelling of --timeout_secs
    assert time.monotonic() - started >= 1.5
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == 'warning: --timeout is deprecated and will be removed: use --timeout_secs'
    assert f'Waiting for the first checkpoint in {checkpoint_dir}' in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        f'error: {checkpoint_dir}: no checkpoint after waiting 1.5 s; train first (python onu_train.py '
        f'--train_dir={checkpoint_dir}) or point --checkpoint_dir at the training run')
    assert not os.path.exists(checkpoint_dir)


def test_without_run_config_the_model_flags_are_required_and_used(polled_run, tmp_path):
    data_dir, train_dir, eval_dir, _ = polled_run
    bare_dir = tmp_path / 'bare'
    bare_dir.mkdir()
    for path in glob.glob(os.path.join(train_dir, f'model.ckpt-{MAX_STEPS}.*')):
        shutil.copy(path, bare_dir)
    shutil.copy(os.path.join(train_dir, 'checkpoint'), bare_dir)
    args = [f'--checkpoint_dir={bare_dir}', f'--eval_dir={tmp_path / "eval"}', '--run_once']
    refused = run_eval(*args)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith(
        f'error: {bare_dir}/run_config.json not found, so the model is unknown')
    assert '--model' in refused.stderr
    evaluated = run_eval(*args, '--model=small', f'--image_size={IMAGE_SIZE}', f'--data_dir={data_dir}')
    assert evaluated.returncode == 0, evaluated.stderr
    [entry] = read_results(str(tmp_path / 'eval'))
    final = read_results(eval_dir)[-1]
    assert (entry['step'], entry['precision_at_1'], entry['confusion_matrix']) == (
        final['step'], final['precision_at_1'], final['confusion_matrix'])


# ----------------------------------------------------------------------------------------------
# What the model gets wrong: the mistakes grid, results.jsonl, TensorBoard, the progress display

def reference_mistakes(checkpoint_path, data_dir):
    """Returns (val file names, labels, softmax probabilities) of the independent computation."""
    labels, logits = reference_logits(checkpoint_path, data_dir, IMAGE_SIZE, shadows=True)
    names = [os.path.relpath(path, data_dir) for name in CLASS_NAMES
             for path in sorted(glob.glob(os.path.join(data_dir, 'val', name, '*')))]
    exponentials = np.exp(logits - logits.max(axis=1, keepdims=True))
    return names, labels, exponentials / exponentials.sum(axis=1, keepdims=True)


@pytest.mark.parametrize('data_format', ['images', 'encoded'])
def test_mistakes_name_exactly_the_files_the_model_gets_wrong(handmade_checkpoints, tiny_data_dir, data_format):
    path = handmade_checkpoints['averaged']
    names, labels, probabilities = reference_mistakes(path, tiny_data_dir)
    predicted = probabilities.argmax(axis=1)
    wrong = [index for index in range(len(names)) if predicted[index] != labels[index]]
    assert 0 < len(wrong) < len(names)  # the handmade model gets some right and some wrong
    most_confident = sorted(wrong, key=lambda index: -probabilities[index, predicted[index]])

    result = onu_eval.evaluate(path, handmade_run_config(tiny_data_dir, data_format), handmade_run_config(tiny_data_dir, data_format).split_info('val'), batch_size=3,
                               max_mistakes=len(wrong) - 1 or 1)
    assert result.predictions.filenames == names
    assert result.predictions.misclassified() == [names[index] for index in wrong]
    shown = result.predictions.mistakes
    assert [mistake.filename for mistake in shown] == [names[index] for index in most_confident][:len(shown)]
    assert len(shown) == max(len(wrong) - 1, 1)
    for mistake, index in zip(shown, most_confident):
        assert (mistake.true_label, mistake.predicted_label) == (labels[index], predicted[index])
        assert mistake.probability == pytest.approx(probabilities[index, predicted[index]], abs=1e-4)
        assert mistake.image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and mistake.image.dtype == np.uint8
    record = onu_eval.result_record(result, handmade_run_config(tiny_data_dir, data_format), 'val')
    assert record['misclassified'] == [names[index] for index in wrong]
    tags = {value.tag: value for value in onu_eval.result_summary(result, result.precision_at_1).value}
    assert tags['eval/mistakes'].image.width > 0 and tags['eval/confusion_matrix_image'].image.height > 0
    assert {'pr_curves/F603', 'pr_curves/F663N'} <= set(tags)


def test_mistakes_kept_batch_by_batch_are_those_of_one_batch(handmade_checkpoints, tmp_path):
    """Keeping the worst mistakes batch by batch keeps the same photos, with the same pixels, as one batch."""
    data_dir = str(tmp_path / 'data')
    onu_sample_data.generate_dataset(data_dir, 1, 12, TINY_IMAGE_SIZE, seed=3, processes=1)
    path, run_config = handmade_checkpoints['averaged'], handmade_run_config(data_dir, 'images')
    whole = onu_eval.evaluate(path, run_config, run_config.split_info('val'), batch_size=64, max_mistakes=100).predictions.mistakes
    assert len(whole) >= 3
    for batch_size, max_mistakes in ((1, 2), (2, len(whole) - 1), (3, 100)):
        kept = onu_eval.evaluate(path, run_config, run_config.split_info('val'), batch_size=batch_size,
                                 max_mistakes=max_mistakes).predictions.mistakes
        assert [mistake.filename for mistake in kept] == [mistake.filename for mistake in whole][:max_mistakes]
        for mine, reference in zip(kept, whole):
            np.testing.assert_array_equal(mine.image, reference.image)


def test_worst_mistakes_of_a_stream_rank_as_all_at_once():
    """Ranking the kept mistakes and each new batch gives the ranking of all examples, ties in input order."""
    generator = np.random.default_rng(7)
    count, num_classes = 500, 3
    # Probabilities from few distinct values, so that many mistakes tie in confidence.
    probabilities = generator.choice([0.1, 0.2, 0.3, 0.5], size=(count, num_classes))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    labels = generator.integers(0, num_classes, count).tolist()
    filenames = [f'val/{index}.jpg' for index in range(count)]
    for max_mistakes in (0, 1, 7, 1000):
        everything = onu_eval_summaries.select_mistakes(filenames, labels, probabilities, max_mistakes)
        chosen = []
        for first in range(0, count, 32):
            chosen = onu_eval.worst_mistakes(sorted(chosen) + list(range(first, min(first + 32, count))),
                                             filenames, list(labels), list(probabilities), max_mistakes)
        assert chosen == everything
    assert len(everything) == sum(np.argmax(probabilities, axis=1) != labels) > 100


def test_max_mistakes_zero_writes_no_grid_but_still_lists_the_mistakes(handmade_checkpoints, tiny_data_dir):
    result = onu_eval.evaluate(handmade_checkpoints['averaged'], handmade_run_config(tiny_data_dir), handmade_run_config(tiny_data_dir).split_info('val'),
                               batch_size=3, max_mistakes=0)
    assert result.predictions.mistakes == [] and result.predictions.misclassified()
    tags = {value.tag for value in onu_eval.result_summary(result, result.precision_at_1).value}
    assert 'eval/mistakes' not in tags and 'eval/confusion_matrix_image' in tags


def test_tensorboard_lists_the_eval_pictures_and_pr_curves(polled_run, tensorboard_server):
    _, train_dir, eval_dir, _ = polled_run
    results = read_results(eval_dir)
    assert any(record['misclassified'] for record in results)  # some checkpoint got photos wrong
    assert os.path.dirname(train_dir) == os.path.dirname(eval_dir)
    server = tensorboard_server(logdir=os.path.dirname(eval_dir))  # runs 'train' and 'eval'
    images = server.wait_for_tags('images', 'eval', ['eval/confusion_matrix_image', 'eval/mistakes'])
    assert 'eval/confusion_matrix_image' in images and 'eval/mistakes' in images
    curves = server.wait_for_tags('pr_curves', 'eval', [f'pr_curves/{name}' for name in CLASS_NAMES])
    assert {f'pr_curves/{name}' for name in CLASS_NAMES} <= set(curves)
    heatmaps = server.wait_for_json('/data/plugin/images/images', lambda entries: len(entries) >= len(results),
                                    f'{len(results)} heatmaps', run='eval', tag='eval/confusion_matrix_image')
    assert [entry['step'] for entry in heatmaps] == [record['step'] for record in results]  # one per checkpoint
    server.wait_for_tags('images', 'train', [f'augmented_inputs/image/{i}'
                                             for i in range(onu_input.NUM_SUMMARY_IMAGES)])


def test_progress_shows_on_a_terminal_only_and_eval_data_picks_the_split(polled_run, tmp_path):
    _, train_dir, _, result = polled_run
    assert 'evaluating' not in result.stdout + result.stderr  # pipes: no progress display
    code, output = run_on_a_terminal('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={tmp_path}',
                                     '--run_once', '--batch_size=2', '--eval_data=train')
    assert code == 0, output
    train_photos = len(CLASS_NAMES) * TRAIN_PER_CLASS
    assert 'evaluating:' in output and f'/{train_photos} [' in output and 'photo/s' in output
    assert 'precision @ 1 = ' in output
    # README: evaluation prints the GPUs it sees and the precision it computes in: float32 unless --precision says.
    assert 'GPUs: none visible' in output and 'precision: float32' in output
    # --eval_data=train: every train photo, once (polled_run's split has 8 per class, val 5).
    [record] = read_results(str(tmp_path))
    assert record['eval_data'] == 'train' and np.sum(record['confusion_matrix'], axis=1).tolist() == [
        TRAIN_PER_CLASS] * len(CLASS_NAMES)
