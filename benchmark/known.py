"""Known or not: how each known score of onu_known tells val photos from photos that are not ONUs (issue 42).

    python -m benchmark.known --train_dir=/tmp/onu_train --work_dir=/tmp/onu_known

Takes the training run of --train_dir (the Quick start's by default) as it is, writes --per_kind photos of every kind
of onu_unrelated_photos into WORK_DIR/unrelated/<kind>/, and measures:
  scores  for every entry of onu_known.SCORES: calibrated on the run's val photos at --known_recall (as an export is),
          the share of val kept (each photo scored by a fit to the others) and the share of each kind called unknown;
  served  the served path end to end: onu_export.py with default flags (and --tflite of every format) into
          WORK_DIR/export, then onu_predict.py --json on the val split and on WORK_DIR/unrelated, per form with a
          known score (the SavedModel, the TFLite formats but int8): the share of val photos known and of each kind
          unknown.
Writes WORK_DIR/known.json and prints Markdown tables with the machine it ran on.
"""
import json
import os
import time

from absl import app
from absl import flags

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmark import runner  # noqa: E402
from onu_lib import onu_checkpoint  # noqa: E402
from onu_lib import onu_known  # noqa: E402
from onu_lib import onu_run_config  # noqa: E402
from onu_lib import onu_serving  # noqa: E402
from onu_lib import onu_tflite  # noqa: E402
from onu_lib import onu_unrelated_photos  # noqa: E402
import onu_input  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string('train_dir', '/tmp/onu_train', 'The training run to measure (the Quick start\'s by default).')
flags.DEFINE_string('work_dir', '/tmp/onu_known', 'Where the photos that are not ONUs, the export and known.json go.')
flags.DEFINE_integer('per_kind', 70, 'Photos of each kind of onu_unrelated_photos.KINDS.')
flags.DEFINE_integer('seed', 1, 'Seed of the photos that are not ONUs.')
flags.DEFINE_float('known_recall', onu_known.DEFAULT_KNOWN_RECALL, 'The share of val photos each score keeps.')

def photo_pixels(paths, image_size):
    """uint8 pixels [n, size, size, 3] of image files, as eval preprocesses them (what an export calibrates on)."""
    with tf.Graph().as_default():
        path = tf.compat.v1.placeholder(tf.string, [])
        pixels = onu_input.to_pixels(onu_input.preprocess_for_eval(
            onu_input.decode_image_bytes(tf.io.read_file(path)), image_size))
        with tf.compat.v1.Session() as session:
            return np.stack([session.run(pixels, {path: name}) for name in paths])


def measure_scores(run_config, checkpoint_path, unrelated):
    """{score: {val_known, unknown: {kind: share}}} of every onu_known score, calibrated on the run's val photos."""
    pixels, labels = onu_serving.known_val_pixels(run_config)
    logits, features, blocks = onu_serving.val_outputs(checkpoint_path, run_config, pixels)
    outputs = {kind: onu_serving.val_outputs(checkpoint_path, run_config, photo_pixels(paths, run_config.image_size))
               for kind, paths in unrelated.items()}
    results = {}
    for score in onu_known.SCORES:
        calibration = onu_known.calibrate(logits, features, labels, blocks, FLAGS.known_recall, score.name)
        unknown = {kind: float(1 - onu_known.known_of(kind_logits, kind_features, calibration)[2].mean())
                   for kind, (kind_logits, kind_features, _) in outputs.items()}
        results[score.name] = {'val_known': calibration.figures['val_known'], 'unknown': unknown,
                               'description': score.description}
    return results


def predicted_unknown(model, folder):
    """{top folder under folder: share of its photos onu_predict.py --json calls unknown} with model as --model_dir."""
    lines = runner.run_repo_script('onu_predict.py', folder, f'--model_dir={model}', '--json').splitlines()
    unknown = {}
    for line in lines:
        prediction = json.loads(line)
        kind = os.path.relpath(prediction['path'], folder).split(os.sep)[0]
        unknown.setdefault(kind, []).append(not prediction['known'])
    return {kind: float(np.mean(values)) for kind, values in unknown.items()}


def measure_served(run_config, unrelated_dir):
    """{form: {val_known, unknown: {kind: share}}} of the export with default flags and each TFLite format."""
    export_dir = os.path.join(FLAGS.work_dir, 'export')
    for entry in onu_tflite.TFLITE_FORMATS:
        runner.run_repo_script('onu_export.py', f'--checkpoint_dir={FLAGS.train_dir}', f'--export_dir={export_dir}',
                               f'--tflite={entry.name}')
    version_dir = onu_serving.version_dirs(export_dir)[-1][1]
    val_dir = os.path.join(run_config.data_dir, 'val')
    forms = [('SavedModel', version_dir)] + [(f'TFLite {entry.name}', onu_tflite.tflite_path(version_dir, entry.name))
                                             for entry in onu_tflite.TFLITE_FORMATS if entry.known]
    results = {}
    for form, model in forms:
        val = predicted_unknown(model, val_dir)
        results[form] = {'val_known': 1 - float(np.mean(list(val.values()))), 'unknown': predicted_unknown(
            model, unrelated_dir)}
    results['export'] = onu_serving.export_known(onu_serving.load_export_config(version_dir))
    return results


def issue_share(unknown):
    """The share unknown over the kinds of onu_unrelated_photos.ISSUE_KINDS (equal photos per kind)."""
    return float(np.mean([unknown[kind] for kind in onu_unrelated_photos.ISSUE_KINDS]))


def markdown(report):
    """The report as BENCHMARKS.md's tables."""
    kinds = onu_unrelated_photos.KIND_NAMES
    header = ('| {} | val known | not ONUs unknown | ' + ' | '.join(kinds) + ' |',
              '|---|---:|---:|' + '---:|' * len(kinds))
    lines = [f'Hardware: {report["hardware"]["cpu_model"]}; TensorFlow {report["hardware"]["tensorflow"]}. Model: '
             f'{report["model"]}, {report["per_kind"]} photos of each kind; "not ONUs" = '
             f'{", ".join(onu_unrelated_photos.ISSUE_KINDS)}.', '', 'Every score at --known_recall='
             f'{report["known_recall"]:g}, calibrated on the val split (val known: each photo scored by a fit to '
             f'the others):', '', header[0].format('score'), header[1]]
    for name, row in report['scores'].items():
        lines.append(f'| {name} | {row["val_known"]:.1%} | {issue_share(row["unknown"]):.1%} | '
                     + ' | '.join(f'{row["unknown"][kind]:.0%}' for kind in kinds) + ' |')
    lines += ['', 'Served (onu_export.py with default flags, onu_predict.py --json; val known: the served model on '
              'the val photos it was calibrated on):', '', header[0].format('form'), header[1]]
    for form, row in report['served'].items():
        if form != 'export':
            lines.append(f'| {form} | {row["val_known"]:.1%} | {issue_share(row["unknown"]):.1%} | '
                         + ' | '.join(f'{row["unknown"][kind]:.0%}' for kind in kinds) + ' |')
    return '\n'.join(lines)


def main(argv):
    del argv
    started = time.time()
    run_config = onu_run_config.RunConfig.load(FLAGS.train_dir)
    checkpoint_path = onu_checkpoint.find_checkpoint(FLAGS.train_dir)
    unrelated_dir = os.path.join(FLAGS.work_dir, 'unrelated')
    unrelated = onu_unrelated_photos.write_unrelated_photos(unrelated_dir, FLAGS.per_kind, FLAGS.seed)
    report = {'hardware': runner.hardware_info(), 'train_dir': FLAGS.train_dir, 'checkpoint': checkpoint_path,
              'model': f'{run_config.model} {run_config.image_size}x{run_config.image_size}, step '
                       f'{onu_checkpoint.checkpoint_step(checkpoint_path)}',
              'per_kind': FLAGS.per_kind, 'known_recall': FLAGS.known_recall,
              'scores': measure_scores(run_config, checkpoint_path, unrelated),
              'served': measure_served(run_config, unrelated_dir)}
    report['seconds'] = round(time.time() - started, 1)
    with open(os.path.join(FLAGS.work_dir, 'known.json'), 'w', encoding='utf-8') as f:
        json.dump(report, f, indent=1)
    print(markdown(report))
    print(f'\n({report["seconds"]:.0f} s; {os.path.join(FLAGS.work_dir, "known.json")})')


if __name__ == '__main__':
    app.run(main)
