"""Generates the sample dataset of ONU-like photos (see onu_sample_data.py), so everything runs on a
fresh machine with no download.

    python make_sample_data.py                      # into /tmp/onu_data, where onu_train.py looks
    python make_sample_data.py --data_dir=DATA --photo_size=1024x768
"""

from onu_lib import onu_cli  # first: quiet start
from absl import app
from absl import flags

from onu_lib import onu_errors
from onu_lib import onu_flags
from onu_lib import onu_sample_data

FLAGS = flags.FLAGS


def define_flags():
    """Declares this script's flags."""
    onu_flags.define_data_dir_flag()
    flags.DEFINE_integer('train_per_class', onu_sample_data.DEFAULT_TRAIN_PER_CLASS, 'Training photos per class.')
    flags.DEFINE_integer('val_per_class', onu_sample_data.DEFAULT_VAL_PER_CLASS, 'Validation photos per class.')
    flags.DEFINE_string('photo_size', '{}x{}'.format(*onu_sample_data.DEFAULT_PHOTO_SIZE),
                        'Size of the generated photos as WIDTHxHEIGHT (the model input size is '
                        'onu_train.py\'s --image_size).')
    onu_flags.define_seed_flag()
    flags.DEFINE_integer('processes', 0, 'Worker processes; 0 = every CPU core.')
    onu_cli.define_deprecated_alias('output_dir', 'data_dir')
    onu_cli.define_deprecated_alias('image_size', 'photo_size')


def parse_photo_size(text):
    """(width, height) from 'WIDTHxHEIGHT'; DataError if malformed."""
    try:
        width, height = (int(part) for part in text.lower().split('x'))
    except ValueError:
        raise onu_errors.DataError(
            f'--photo_size={text!r} is not WIDTHxHEIGHT: use e.g. --photo_size=800x600') from None
    if min(width, height) < 32:
        raise onu_errors.DataError(f'--photo_size={text!r} is too small: use at least 32x32')
    return width, height


def generate():
    """Generates the sample dataset from flags and prints what was done."""
    info = onu_sample_data.generate_dataset(FLAGS.data_dir, FLAGS.train_per_class, FLAGS.val_per_class,
                                            parse_photo_size(FLAGS.photo_size), FLAGS.seed, FLAGS.processes)
    if info['generated']:
        print(f'wrote {info["files"]} photos ({info["bytes"] / 1e6:.1f} MB, '
              f'{info["bytes"] / info["files"] / 1e3:.0f} KB each) to {FLAGS.data_dir} in {info["seconds"]:.1f} s')
    else:
        print(f'{FLAGS.data_dir} already holds this sample data; nothing to do')


def main(argv):
    return onu_cli.run_script(generate, argv)


if __name__ == '__main__':
    define_flags()
    app.run(main)
