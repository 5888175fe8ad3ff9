"""Exports a trained ONU classifier as a SavedModel that TF Serving, saved_model_cli and TF2 load.

    python onu_export.py --checkpoint_dir=/tmp/onu_train                # latest checkpoint
    python onu_export.py --checkpoint_path=/tmp/onu_train/model.ckpt-2000 --export_dir=/srv/onu

The layout, signatures and metadata of what is written: see onu_serving.py.
"""
import os

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags

from onu_lib import onu_checkpoint
from onu_lib import onu_flags
from onu_lib import onu_serving

FLAGS = flags.FLAGS


def define_flags():
    """Declares this script's flags."""
    onu_flags.define_checkpoint_dir_flag(
        'The training run (onu_train.py --train_dir): run_config.json and checkpoints.')
    flags.DEFINE_string('checkpoint_path', None,
                        'Checkpoint to export (default: the latest in --checkpoint_dir).')
    flags.DEFINE_string('export_dir', None,
                        'Where version folders <global_step>/ go; default: <checkpoint_dir>/export.')
    onu_flags.define_allow_raw_weights_flag(
        'Export the raw weights when the checkpoint has no moving averages.')


def export():
    """Exports the checkpoint the flags name (export_saved_model prints where to)."""
    checkpoint_dir = FLAGS.checkpoint_dir
    if FLAGS.checkpoint_path and not FLAGS['checkpoint_dir'].present:
        checkpoint_dir = os.path.dirname(FLAGS.checkpoint_path) or '.'
    run_config = onu_serving.load_training_config(checkpoint_dir)
    checkpoint_path = onu_checkpoint.find_checkpoint(checkpoint_dir, FLAGS.checkpoint_path)
    export_dir = FLAGS.export_dir or onu_serving.default_export_dir(checkpoint_dir)
    onu_serving.export_saved_model(checkpoint_path, run_config, export_dir, FLAGS.allow_raw_weights)


def main(argv):
    return onu_cli.run_script(export, argv)


if __name__ == '__main__':
    define_flags()
    app.run(main)
