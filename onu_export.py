"""Exports a trained ONU classifier as a SavedModel that TF Serving, saved_model_cli and TF2 load, and as TensorFlow Lite.

    python onu_export.py --checkpoint_dir=/tmp/onu_train                # latest checkpoint
    python onu_export.py --checkpoint_path=/tmp/onu_train/model.ckpt-2000 --export_dir=/srv/onu
    python onu_export.py --checkpoint_dir=/tmp/onu_train/eval/best --tflite=int8   # the best, for phones

The layout, signatures and metadata of what is written: see onu_serving.py. The export fits a temperature and the
known threshold (--known_recall) on the val split of the run's data (--data_dir): onu_known. --tflite also writes
model_<format>.tflite, its model_<format>.known.json and labels.txt into the version folder (onu_tflite.py: uint8
pixels in, probabilities and known_score out); a version folder that exists already gets the .tflite it lacks.
"""
import os

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags

from onu_lib import onu_checkpoint
from onu_lib import onu_errors
from onu_lib import onu_flags
from onu_lib import onu_photos
from onu_lib import onu_run_folder
from onu_lib import onu_serving
from onu_lib import onu_tflite

FLAGS = flags.FLAGS


def define_flags():
    """Declares this script's flags."""
    onu_flags.define_checkpoint_dir_flag(
        'The training run (onu_train.py --train_dir): run_config.json and checkpoints.')
    flags.DEFINE_string('checkpoint_path', None,
                        'Checkpoint to export (default: the latest in --checkpoint_dir).')
    flags.DEFINE_string('export_dir', None,
                        'Where version folders <global_step>/ go; default: <checkpoint_dir>/export (for an '
                        'evaluator\'s best/ folder, which each new best replaces whole: EVAL_DIR/export beside it).')
    onu_flags.define_allow_raw_weights_flag(
        'Export the raw weights when the checkpoint has no moving averages.')
    flags.DEFINE_enum('tflite', None, onu_tflite.TFLITE_FORMAT_NAMES,
                      'Also write a TensorFlow Lite model of this format into the version folder (uint8 pixels in, '
                      'probabilities out): float32, float16 (half the size) or int8 (full-integer, calibrated).')
    flags.DEFINE_integer('calibration_examples', onu_tflite.DEFAULT_CALIBRATION_EXAMPLES,
                         '--tflite=int8: photos of the train split (spread over it, eval preprocessing) that '
                         'calibrate the int8 ranges.', lower_bound=1)
    flags.DEFINE_integer('max_image_pixels', onu_photos.MAX_IMAGE_PIXELS,
                         'serving_default refuses an image of more pixels (width x height from its header; a GIF\'s '
                         'frames each count) before decoding it, naming the limit and its size; recorded in the '
                         'export. The default is 20% over the 50 MP photos of the phones ONU technicians use, and '
                         'keeps one decode under about 180 MB (a 1 MB PNG of one colour can declare 529 M pixels).',
                         lower_bound=1)
    onu_flags.define_known_recall_flag()
    onu_flags.define_data_dir_flag()  # default here: the training run's: its val photos calibrate the known score, its
    # train photos --tflite=int8's ranges


def calibration(run_config):
    """The uint8 pixels of --calibration_examples train photos of the run's data; DataError when there are none."""
    data_dir = onu_flags.value_or_saved('data_dir', run_config)
    try:
        return onu_tflite.calibration_pixels(run_config, data_dir, FLAGS.calibration_examples)
    except onu_errors.DataError as e:
        raise onu_errors.DataError(
            f'--tflite={FLAGS.tflite} calibrates on photos of the train split, and there are none at hand '
            f'({str(e).split("; ")[0]}): pass --data_dir=<the training data>, or choose --tflite=float16 (no '
            f'calibration)') from None


def export():
    """Exports the checkpoint the flags name (export_saved_model and write_tflite print where to)."""
    checkpoint_dir = FLAGS.checkpoint_dir
    if FLAGS.checkpoint_path and not FLAGS['checkpoint_dir'].present:
        checkpoint_dir = os.path.dirname(FLAGS.checkpoint_path) or '.'
    run_config = onu_serving.load_training_config(checkpoint_dir)
    checkpoint_path = onu_checkpoint.find_checkpoint(checkpoint_dir, FLAGS.checkpoint_path)
    export_dir = FLAGS.export_dir or onu_serving.default_export_dir(checkpoint_dir)
    pixels = calibration(run_config) if FLAGS.tflite and onu_tflite.tflite_format(FLAGS.tflite).calibrated else None
    data_dir = onu_flags.value_or_saved('data_dir', run_config)
    try:
        version_dir = onu_serving.export_saved_model(checkpoint_path, run_config, export_dir, FLAGS.allow_raw_weights,
                                                     FLAGS.max_image_pixels, FLAGS.known_recall, data_dir)
        if FLAGS.tflite:
            val_pixels = onu_serving.known_val_pixels(run_config, data_dir)[0]
            with onu_cli.tflite_lines_dropped():
                onu_tflite.write_tflite(version_dir, FLAGS.tflite, run_config, pixels, val_pixels)
    except Exception as e:  # pylint: disable=broad-except  (OSError, or TensorFlow's own error for the same cause)
        reason = onu_run_folder.write_failure(e, export_dir)
        if reason is None:
            raise
        raise onu_run_folder.write_failed(export_dir, reason, 'exporting') from None


def main(argv):
    return onu_cli.run_script(export, argv, failures=(onu_run_folder.WriteFailed,))


if __name__ == '__main__':
    define_flags()
    app.run(main)
