"""The model as shipped: SavedModel float32 against TensorFlow Lite float32, float16 and int8, per model.

    python -m benchmark.shipping --data_dir=/tmp/onu_data --work_dir=/tmp/onu_shipping

For each model of --models (at its --image_size), trains it with onu_train.py into WORK_DIR/<model>-<size>/train
(unless a run of --max_steps is there already), exports its latest checkpoint with onu_export.py --tflite=<format>
for every format of onu_tflite.TFLITE_FORMATS (int8 calibrated on --calibration_examples train photos), and measures
each form on the whole val split: precision @ 1, the share of images given the SavedModel's class, file size (the
SavedModel's: its variables, the weights), and ms per image at batch 1 on one core (the median over --timed_images
single images; LiteRT with num_threads=1, the SavedModel in a session with one intra- and one inter-op thread, all in
a child process confined to one CPU from its start). Every form gets the same input, the val photos as eval
preprocesses them rounded to uint8 pixels (the SavedModel through its predict_pixels signature), so the rows differ
only in the model's arithmetic. Writes WORK_DIR/shipping.json and prints a Markdown table with the machine it ran on.
"""
from importlib import metadata
import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402
from ai_edge_litert.interpreter import Interpreter  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmark import runner  # noqa: E402
from onu_lib import onu_run_config  # noqa: E402
from onu_lib import onu_serving  # noqa: E402
from onu_lib import onu_tflite  # noqa: E402
import onu_input  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', '/tmp/onu_data', 'Photos with a train/val split (make_sample_data.py makes some).')
flags.DEFINE_string('work_dir', '/tmp/onu_shipping', 'Where the training runs, exports and shipping.json go.')
# Inception-ResNet-v2 twice: at 299 (its size: the speed and size a phone would see; 150 steps do not train it) and at
# 128 (cheap enough to train on a CPU to a precision worth comparing).
flags.DEFINE_list('models', ['small', 'inception_resnet_v2', 'inception_resnet_v2'], 'Models to train (or reuse).')
flags.DEFINE_list('image_size', ['64', '299', '128'], 'Image size per model of --models, in its order.')
flags.DEFINE_list('max_steps', ['600', '150', '400'], 'Training steps per model of --models, in its order.')
flags.DEFINE_list('batch_size', ['32', '8', '16'], 'Training batch size per model of --models, in its order.')
flags.DEFINE_integer('calibration_examples', onu_tflite.DEFAULT_CALIBRATION_EXAMPLES, 'int8 calibration photos.')
flags.DEFINE_integer('timed_images', 100, 'Images timed per form (after 10 untimed), batch 1, one core.')
flags.DEFINE_string('measure_version', None, 'Internal: measure the forms of this export version (one process).')

SAVED_MODEL = 'SavedModel float32'


def trained_run(model_name, image_size, max_steps, batch_size):
    """Trains model_name into WORK_DIR/<model>-<size>/train unless it holds a run of max_steps; returns the train_dir."""
    train_dir = os.path.join(FLAGS.work_dir, f'{model_name}-{image_size}', 'train')
    if tf.train.latest_checkpoint(train_dir) != os.path.join(train_dir, f'model.ckpt-{max_steps}'):
        print(f'Training {model_name} for {max_steps} steps of {batch_size} into {train_dir}', flush=True)
        runner.run_repo_script('onu_train.py', f'--data_dir={FLAGS.data_dir}', f'--train_dir={train_dir}',
                               f'--model={model_name}', f'--image_size={image_size}', f'--max_steps={max_steps}',
                               f'--batch_size={batch_size}', '--log_frequency=10')
    return train_dir


def exported(train_dir):
    """Exports the run's latest checkpoint with every TFLite format; returns the version folder."""
    export_dir = os.path.join(os.path.dirname(train_dir), 'export')
    for entry in onu_tflite.TFLITE_FORMATS:
        runner.run_repo_script('onu_export.py', f'--checkpoint_dir={train_dir}', f'--export_dir={export_dir}',
                               f'--tflite={entry.name}', f'--calibration_examples={FLAGS.calibration_examples}')
    return onu_serving.version_dirs(export_dir)[-1][1]


def saved_model_predictor(version_dir):
    """A function pixels [1, size, size, 3] -> probabilities of the SavedModel, in a one-thread session."""
    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
                                      use_per_session_threads=True)
    session = tf.compat.v1.Session(graph=graph, config=config)
    signature = tf.compat.v1.saved_model.load(session, onu_serving.SAVED_MODEL_TAGS, version_dir).signature_def[
        onu_serving.PIXELS_SIGNATURE]
    given = graph.get_tensor_by_name(signature.inputs[onu_serving.PIXELS_INPUT].name)
    output = graph.get_tensor_by_name(signature.outputs[onu_serving.OUTPUT_PROBABILITIES].name)
    return lambda pixels: session.run(output, {given: pixels})[0]


def tflite_predictor(path):
    """A function pixels [1, size, size, 3] -> probabilities of the .tflite, LiteRT on one thread."""
    interpreter = Interpreter(model_path=path, num_threads=1)
    with onu_cli.tflite_lines_dropped():
        interpreter.allocate_tensors()
        output = onu_tflite.output_details(interpreter)[onu_serving.OUTPUT_PROBABILITIES]['index']
    given = interpreter.get_input_details()[0]['index']

    def predict(pixels):
        interpreter.set_tensor(given, pixels)
        interpreter.invoke()
        return interpreter.get_tensor(output)[0]
    return predict


def measure(predict, pixels, labels):
    """({precision_at_1, ms_per_image (median of single images)}, probabilities) of a predictor on every val image."""
    probabilities = np.array([predict(image[np.newaxis]) for image in pixels])
    predictions = probabilities.argmax(axis=1)
    for image in pixels[:10]:  # warm-up
        predict(image[np.newaxis])
    times = []
    for image in pixels[:FLAGS.timed_images]:
        started = time.perf_counter()
        predict(image[np.newaxis])
        times.append(time.perf_counter() - started)
    return ({'precision_at_1': float((predictions == labels).mean()), 'ms_per_image': statistics.median(times) * 1000},
            probabilities)


def measure_forms(version_dir):
    """The rows of every form of the export in version_dir: the SavedModel, then every TFLite format."""
    run_config = onu_serving.load_export_config(version_dir)
    info = run_config.split_info('val')
    pixels, labels = onu_input.eval_pixels(info, run_config.image_size, info.num_examples)  # the whole val split
    forms = [(SAVED_MODEL, saved_model_predictor(version_dir),
              runner.folder_bytes(os.path.join(version_dir, 'variables')))]
    forms += [(f'TFLite {entry.name}', tflite_predictor(onu_tflite.tflite_path(version_dir, entry.name)),
               os.path.getsize(onu_tflite.tflite_path(version_dir, entry.name))) for entry in onu_tflite.TFLITE_FORMATS]
    rows, saved_model = [], None
    for form, predict, size in forms:
        figures, probabilities = measure(predict, pixels, labels)
        saved_model = probabilities if saved_model is None else saved_model
        rows.append({'form': form, 'bytes': size, **figures, 'val_examples': len(labels),
                     # How far from the SavedModel: the share of the same classes, the largest probability difference.
                     'same_class': float((probabilities.argmax(axis=1) == saved_model.argmax(axis=1)).mean()),
                     'max_difference': float(np.abs(probabilities - saved_model).max())})
    return rows


def measured_on_one_core(version_dir):
    """measure_forms in a fresh process confined to one CPU from its start (every thread TensorFlow and LiteRT make
    inherits it; confining a running process would leave the threads it has already started free)."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    done = subprocess.run([sys.executable, '-m', 'benchmark.shipping', f'--measure_version={version_dir}',
                           f'--timed_images={FLAGS.timed_images}'], cwd=runner.REPO_DIR, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    if done.returncode:
        sys.exit(f'measuring {version_dir} failed:\n{done.stderr[-3000:]}')
    return json.loads(done.stdout.splitlines()[-1])


def measure_model(model_name, image_size, max_steps, batch_size):
    """The rows of one model: the SavedModel and every TFLite format."""
    train_dir = trained_run(model_name, image_size, max_steps, batch_size)
    version_dir = exported(train_dir)
    run_config = onu_run_config.RunConfig.load(train_dir)
    rows = measured_on_one_core(version_dir)
    for row in rows:
        print(json.dumps({'model': model_name, **row}), flush=True)
    step = onu_serving.load_export_config(version_dir).export['global_step']
    return {'model': model_name, 'image_size': run_config.image_size, 'steps': step, 'batch_size': batch_size,
            'saved_model_bytes': runner.folder_bytes(version_dir) - sum(
                os.path.getsize(onu_tflite.tflite_path(version_dir, entry.name)) for entry in onu_tflite.TFLITE_FORMATS),
            'rows': rows}


def markdown(report):
    """The report as BENCHMARKS.md's table, each row against its model's SavedModel."""
    lines = [f'Hardware: {report["hardware"]["cpu_model"]}; one core, batch 1; TensorFlow '
             f'{report["hardware"]["tensorflow"]}, LiteRT {report["litert"]}.', '',
             '| model | form | precision @ 1 | vs SavedModel | same class | MiB | x weights | ms/image | speed-up |',
             '|---|---|---|---|---|---|---|---|---|']
    for model in report['models']:
        base = model['rows'][0]
        for row in model['rows']:
            lines.append(
                f'| {model["model"]} {model["image_size"]}px, {model["steps"]} steps | {row["form"]} | {row["precision_at_1"]:.3f} | '
                f'{(row["precision_at_1"] - base["precision_at_1"]) * 100:+.1f} pt | {row["same_class"]:.3f} | '
                f'{row["bytes"] / 2**20:.2f} | '
                f'{row["bytes"] / base["bytes"]:.2f}x | {row["ms_per_image"]:.2f} | '
                f'{base["ms_per_image"] / row["ms_per_image"]:.2f}x |')
    return '\n'.join(lines)


def main(argv):
    del argv
    if FLAGS.measure_version:  # the child of measured_on_one_core
        print(json.dumps(measure_forms(FLAGS.measure_version)))
        return
    report = {'hardware': runner.hardware_info(), 'litert': metadata.version('ai-edge-litert'),
              'data_dir': FLAGS.data_dir, 'models': []}
    for model_name, image_size, max_steps, batch_size in zip(FLAGS.models, FLAGS.image_size, FLAGS.max_steps,
                                                             FLAGS.batch_size):
        report['models'].append(measure_model(model_name, int(image_size), int(max_steps), int(batch_size)))
    os.makedirs(FLAGS.work_dir, exist_ok=True)
    with open(os.path.join(FLAGS.work_dir, 'shipping.json'), 'w', encoding='utf-8') as f:
        json.dump(report, f, indent=1)
    print(markdown(report))


if __name__ == '__main__':
    app.run(main)
