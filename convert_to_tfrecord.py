"""Converts a photo folder (DATA/train/<class>/*, DATA/val/<class>/*, or PHOTOS/<class>/* split by
--validation_percent), or the records another tool wrote (onu_layouts.py), into this repo's TFRecords
(onu_converter.py), once for many trainings; prints the records' size against their source and the files skipped.

    python convert_to_tfrecord.py                   # /tmp/onu_data, where onu_train.py looks
    python convert_to_tfrecord.py --data_dir=DATA --format=both
    python convert_to_tfrecord.py --data_dir=STUDY --format=encoded   # the study's raw records -> encoded
"""
from onu_lib import onu_cli  # first: quiet start
from absl import app
from absl import flags

from onu_lib import onu_converter
from onu_lib import onu_dataset
from onu_lib import onu_flags

FLAGS = flags.FLAGS


def define_flags():
    """Declares this script's flags."""
    onu_flags.define_data_dir_flag()
    onu_flags.define_split_flags()
    flags.DEFINE_string('output_dir', None, 'Where to write the records; default <data_dir>/tfrecords, or a folder '
                        'of its own in the cache (~/.cache/onu-classifier/records/) when data_dir is read-only.')
    flags.DEFINE_enum('format', 'both', ['raw', 'encoded', 'both'], 'Which record kinds to write.')
    flags.DEFINE_integer('num_shards', 0, 'Shards per split and format; 0 = about 100 MB each.')
    flags.DEFINE_enum('compression', 'NONE', list(onu_dataset.COMPRESSIONS), 'TFRecord compression.')
    flags.DEFINE_boolean('strict', False, 'Fail instead of skipping unreadable files.')
    flags.DEFINE_boolean('overwrite', False, 'Rebuild the records even if they are up to date.')
    flags.DEFINE_integer('processes', 0, 'Decoding processes; 0 = every CPU core.')
    onu_flags.define_seed_flag()


def convert():
    """Converts the folder given by flags and prints the summary table."""
    formats = onu_dataset.RECORD_FORMATS if FLAGS.format == 'both' else (FLAGS.format,)
    data = onu_dataset.describe(FLAGS.data_dir, FLAGS.validation_percent, FLAGS.labels_offset)
    manifest = onu_converter.convert(data, FLAGS.output_dir, formats, FLAGS.num_shards, FLAGS.compression,
                                     FLAGS.strict, FLAGS.overwrite, FLAGS.processes, FLAGS.seed)
    print(onu_converter.summary_table(manifest))


def main(argv):
    return onu_cli.run_script(convert, argv)


if __name__ == '__main__':
    define_flags()
    app.run(main)
