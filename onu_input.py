"""Bytes -> tensors for the ONU classifier (the CIFAR-10 tutorial's cifar10_input.py role).

Three ways to feed the same photos, built with tf.data inside the caller's tf.compat.v1 graph:
  images   the original files under data_dir/{train,val}/<class>/ (or bare <class>/ folders, split by
           onu_dataset.split_of), decoded at training time;
  raw      TFRecords of decoded pixels (image/raw), read back with tf.io.decode_raw;
  encoded  TFRecords of the original file bytes (image/encoded), decoded like the files.
All three give the same pixels for the same photo: upright (EXIF applied), RGB, same resize. Records other
tools wrote (onu_layouts: the study's, TF-slim's, Inception's, TFDS's) are read as they are, with the keys,
label offset and class names found there.

    info = dataset_info(data_dir, 'encoded', 'train')       # what to read, found once
    images, labels = distorted_inputs(info, batch_size=32, image_size=299)
    images, labels = inputs(dataset_info(data_dir, 'encoded', 'val'), batch_size=32, image_size=299)

Images are float32 [batch, size, size, 3] in [-1, 1] (what Inception checkpoints expect), labels
int32 [batch]. preprocess_for_eval is the one eval/serving preprocessing; export reuses it with
decode_image_bytes. Training decodes and resizes each photo to uint8, keeps the decoded epoch in
memory when it fits, and augments whole batches with augment_batch (one XLA function, per-image
draws; the augmentations are the entries of AUGMENTATIONS), in the pipeline or, with augment_on='model',
on the model's device:

    images, labels, draws = undistorted_inputs(info, 32, 299)   # uint8, for the model
    images = augment_batch(images, draws)

With data_service (grpc://HOST:PORT), a tf.data service's workers make the same training batches
(_service_batches) and the trainer only receives them.
"""
import contextlib
import dataclasses
import functools
import math
import os
import re
import threading
import typing
import warnings
import zlib

from absl import logging
import numpy as np
import tensorflow as tf
from tqdm import tqdm
from tensorflow.core.framework import model_pb2

from onu_lib import onu_dataset
from onu_lib import onu_layouts

# Corners uncovered by a rotation: mid grey, which is 0 in the model's [-1, 1] range.
ROTATION_FILL_VALUE = 0.5
# Where an augmentation's op runs (augment_batch runs them in this order) and what it takes; parameters are
# [batch], one per image, and weight is [batch, h, w, 1]: covered, or ones when no pixel is uncovered.
#   geometry  op(images, covered, parameters) -> (images, covered): moves pixels. images: the uint8 batch, or
#             float in [0, 1] once an op resampled it; covered: the share of each pixel the photo covers, or None
#             while it covers them all (the rest becomes ROTATION_FILL_VALUE at the end).
#   hsv       op(channels, weight, parameters) -> channels: on {'hue', 'saturation', 'value'} ([batch, h, w]
#             each), all such ops in one HSV round trip.
#   rgb       op(images, weight, parameters) -> images: on float RGB in [0, 1], unclipped.
AUGMENTATION_SPACES = ('geometry', 'hsv', 'rgb')
HSV_CHANNELS = ('hue', 'saturation', 'value')

# Shuffling records holds them in memory: the buffer is sized to this many bytes of records.
SHUFFLE_BUFFER_BYTES = 256 * 2**20
MAX_SHUFFLE_BUFFER = 10000
NUM_SUMMARY_IMAGES = 3
PIPELINE_DEVICE = '/cpu:0'
# Where training augmentation runs: in the tf.data pipeline, or in the training graph on the model's
# device (the pipeline then ships resized uint8 images and the draws).
AUGMENT_PLACEMENTS = ('input', 'model')
# The first value of the message of the error a record's label outside the classes raises (_parse_record).
LABEL_OUT_OF_RANGE = 'label outside the classes:'
# What TensorFlow's messages say of a record whose keys or values are not those of the first record.
UNREADABLE_RECORD_SIGNS = ('is required but could not be found', 'Could not parse', 'Can\'t parse',
                           'Input to reshape')
# JPEG DCT scale divisors libjpeg decodes at (1 = full size).
DCT_RATIOS = (1, 2, 4, 8)
# Training keeps the resized uint8 images of one epoch in memory when they take at most this many
# bytes: later epochs then skip reading and decoding and pay only for the augmentation.
DECODED_CACHE_BYTES = 2 * 2**30


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """One training augmentation (an entry of AUGMENTATIONS): its name, as --augmentations spells it; the range
    [low, high] its per-image parameter is drawn from, uniformly; where its batched op runs (one of
    AUGMENTATION_SPACES) and the op; and whether training applies it when --augmentations is not given."""
    name: str
    low: float
    high: float
    space: str
    apply: typing.Callable
    on_by_default: bool = True

    def __post_init__(self):
        _check_choice(f'the space of augmentation {self.name}', self.space, AUGMENTATION_SPACES)

    @property
    def stream(self):
        """Returns the id of this augmentation's seed stream: a hash of its name, the same in every process."""
        return zlib.crc32(self.name.encode())


@dataclasses.dataclass(frozen=True)
class AugmentOptions:
    """Which training augmentations are on: names of AUGMENTATIONS (their ranges are the registry's)."""
    names: frozenset

    def __post_init__(self):
        object.__setattr__(self, 'names', frozenset(self.names))
        unknown = sorted(self.names - set(augmentation_names()))
        if unknown:
            raise ValueError(f'unknown augmentation {", ".join(unknown)}; the augmentations are '
                             f'{", ".join(augmentation_names())}')

    @classmethod
    def all(cls):
        """Returns options with every augmentation on."""
        return cls(augmentation_names())

    @classmethod
    def default(cls):
        """Returns options with the augmentations that are on by default (--augmentations' default)."""
        return cls(default_augmentation_names())

    @classmethod
    def none(cls):
        """Returns options with every augmentation off."""
        return cls(())

    @classmethod
    def of(cls, augment):
        """Returns AugmentOptions for True (the default ones on), False/None (all off) or AugmentOptions."""
        if isinstance(augment, cls):
            return augment
        return cls.default() if augment else cls.none()


def augmentation_names():
    """Returns the names of AUGMENTATIONS, in its order: --augmentations' choices and default."""
    return tuple(augmentation.name for augmentation in AUGMENTATIONS)


def default_augmentation_names():
    """Returns the names of the augmentations that are on by default, in AUGMENTATIONS' order."""
    return tuple(augmentation.name for augmentation in AUGMENTATIONS if augmentation.on_by_default)


def augmentation_named(name):
    """Returns the entry of AUGMENTATIONS called name (a one-line ValueError if there is none)."""
    for augmentation in AUGMENTATIONS:
        if augmentation.name == name:
            return augmentation
    raise ValueError(f'unknown augmentation {name}; the augmentations are {", ".join(augmentation_names())}')


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What one split in one data format holds: classes, example count, the files to read and how."""
    data_dir: str
    data_format: str
    split: str
    class_names: tuple
    num_examples: int
    files: tuple                 # record shards, or image files in images mode
    layout: str = 'photos'       # photos, class_folders (no split), records (this repo's), or an onu_layouts name
    labels: tuple = ()           # images mode: the class id of each file
    orientations: tuple = ()     # images mode: the EXIF orientation (1-8) of each file
    records_per_file: tuple = ()  # record modes: the count of each shard
    compression_type: str = ''  # record modes: as TFRecordDataset spells it ('' for none)
    bytes_per_example: int = 0   # record modes: average record size, sizes the shuffle buffer
    skipped: tuple = ()          # images mode: (path, reason) of files left out when listing
    image_key: str = ''          # record modes: the feature holding the image (raw pixels or encoded bytes)
    label_key: str = onu_dataset.KEY_LABEL
    filename_key: str = onu_dataset.KEY_FILENAME  # '' when the records name no file
    labels_offset: int = 0       # record modes: class = stored label - labels_offset
    # Other tools' records, read as they are or converted: the --labels_offset their labels were read with.
    data_labels_offset: int = None
    validation_percent: float = None  # class_folders: the share held out for val (onu_dataset.split_of)

    @property
    def num_classes(self):
        """Returns the number of classes."""
        return len(self.class_names)


def _check_choice(name, value, choices):
    """Raises ValueError unless value is one of choices."""
    if value not in choices:
        raise ValueError(f'{name}={value!r}; expected one of {", ".join(choices)}')


def _convert_command(data_dir, data_format):
    """Returns the command line that writes data_format records for data_dir."""
    return f'python convert_to_tfrecord.py --data_dir={data_dir} --format={data_format}'


def _repo_records_formats(data_dir):
    """Returns the record formats this repo's records of data_dir hold for every split (() if none)."""
    formats = set()
    for records_dir in onu_dataset.records_dirs(data_dir):
        splits = onu_dataset.read_manifest(records_dir).get('splits', {})
        formats.update(fmt for fmt in onu_dataset.RECORD_FORMATS
                       if splits and all(fmt in formats_of_split for formats_of_split in splits.values()))
    return tuple(fmt for fmt in onu_dataset.RECORD_FORMATS if fmt in formats)


def _made_otherwise(data_dir, data_format, validation_percent, labels_offset):
    """Returns why this repo's data_format records of data_dir do not fit the asked split or labels offset, or None."""
    records_dir = onu_dataset.records_dir_for(data_dir, data_format)
    manifest = onu_dataset.read_manifest(records_dir)
    split_by = manifest.get('validation_percent')
    wanted = onu_dataset.DEFAULT_VALIDATION_PERCENT if validation_percent is None else validation_percent
    if split_by is not None and split_by != wanted:
        return (f'{records_dir}: records split with --validation_percent={split_by:g}, but {wanted:g} is asked; use '
                f'--validation_percent={split_by:g}, or re-create them with '
                f'{_convert_command(data_dir, data_format)} --validation_percent={wanted:g}')
    offset = manifest.get('source', {}).get('labels_offset')
    if labels_offset is not None and offset is not None and offset != labels_offset:
        return (f'{records_dir}: records made with --labels_offset={offset}, but {labels_offset} is asked; use '
                f'--labels_offset={offset}, or re-create them with {_convert_command(data_dir, data_format)} '
                f'--labels_offset={labels_offset}')
    return None


def has_records(data_dir, data_format, validation_percent=None, labels_offset=None):
    """Returns True when data_dir has data_format records to read: this repo's (every split), or another tool's.

    This repo's records count only when made with validation_percent (bare class folders; None: the default)
    and labels_offset (other tools' records; None: any).
    """
    if not os.path.isdir(data_dir):
        return False
    if data_format in _repo_records_formats(data_dir):
        return _made_otherwise(data_dir, data_format, validation_percent, labels_offset) is None
    foreign = onu_layouts.find_foreign_records(data_dir)
    return foreign is not None and data_format in foreign.data_formats


def has_photos(data_dir):
    """Returns True when data_dir holds photo folders (train/<class>/ or bare <class>/ folders), not only records."""
    if not os.path.isdir(data_dir):
        return False
    return onu_dataset.has_split_folders(data_dir) or (
        onu_layouts.find_foreign_records(data_dir) is None and bool(onu_dataset.bare_class_folders(data_dir)))


def record_formats(data_dir):
    """Returns the record formats data_dir has to read, this repo's or another tool's: encoded, then raw."""
    formats = set(_repo_records_formats(data_dir))
    foreign = onu_layouts.find_foreign_records(data_dir)
    formats.update(foreign.data_formats if foreign is not None else ())
    return tuple(fmt for fmt in ('encoded', 'raw') if fmt in formats)


def default_data_format(data_dir):
    """Returns the data format to read when none is asked: encoded for photos, else the records' own (encoded first)."""
    if not os.path.isdir(data_dir) or has_photos(data_dir):
        return 'encoded'
    return (record_formats(data_dir) or ('encoded',))[0]


def reads_other_tools_records(data_dir, data_format):
    """Returns True when data_format is read from records another tool wrote in data_dir (none of this repo's)."""
    return (data_format != 'images' and data_format not in _repo_records_formats(data_dir)
            and onu_layouts.find_foreign_records(data_dir) is not None)


def data_layout(data_dir):
    """Returns the layout data_dir holds: photos, class_folders, records, or an onu_layouts name; DataError if none.

    The error is one line saying what was looked for.
    """
    if not os.path.isdir(data_dir):
        raise onu_dataset.missing_data_dir_error(data_dir)
    if onu_dataset.has_split_folders(data_dir):
        return 'photos'
    foreign = onu_layouts.find_foreign_records(data_dir)
    if foreign is not None:
        return foreign.layout.name
    if onu_dataset.bare_class_folders(data_dir):
        return 'class_folders'
    if _repo_records_formats(data_dir):
        return 'records'
    raise onu_dataset.DataError(
        f'{data_dir}: no data found; looked for photos in train/<class>/ and val/<class>/ or in <class>/ folders, '
        f'this repo\'s records (manifest.json, from convert_to_tfrecord.py), and the records of other tools: '
        f'{onu_layouts.looked_for()}; see README "Bring your own data"')


def dataset_info(data_dir, data_format, split, validation_percent=None, labels_offset=None):
    """Returns the DatasetInfo of one split, raising DataError naming the path and the fix.

    validation_percent: bare class folders' held-out share (default onu_dataset.DEFAULT_VALIDATION_PERCENT);
    labels_offset: other tools' records' (None: from evidence, onu_layouts).
    """
    _check_choice('data_format', data_format, onu_dataset.DATA_FORMATS)
    _check_choice('split', split, onu_dataset.SPLITS)
    if not os.path.isdir(data_dir):
        raise onu_dataset.missing_data_dir_error(data_dir)
    if validation_percent is None:
        validation_percent = onu_dataset.DEFAULT_VALIDATION_PERCENT
    if data_format == 'images':
        return _images_info(data_dir, split, validation_percent)
    if reads_other_tools_records(data_dir, data_format):
        return _other_tools_records_info(data_dir, data_format, split, labels_offset)
    return _records_info(data_dir, data_format, split, validation_percent, labels_offset)


_warned_paths = set()
_warned_paths_lock = threading.Lock()


def _warn_once(path, message, *args):
    """Logs a warning about path the first time this process sees it."""
    with _warned_paths_lock:
        if path in _warned_paths:
            return
        _warned_paths.add(path)
    logging.warning(message, *args)


def _images_info(data_dir, split, validation_percent):
    """Returns the DatasetInfo of split read from the class folders (split folders, or split_of's for bare ones)."""
    if onu_layouts.find_foreign_records(data_dir) is not None:
        raise onu_dataset.DataError(
            f'{data_dir}: holds the records of another tool, not photo folders: read them with '
            f'--data_format={default_data_format(data_dir)}')
    class_names = onu_dataset.find_class_names(data_dir)
    bare = not onu_dataset.has_split_folders(data_dir)
    split_dir = data_dir if bare else onu_dataset.split_dir(data_dir, split)
    if not os.path.isdir(split_dir):
        raise onu_dataset.DataError(
            f'{split_dir}: no {split} photos; put them in {split_dir}/<class>/ '
            f'with the classes of {os.path.join(data_dir, "train")}')
    images, skipped = onu_dataset.list_split_images(data_dir, split, class_names, validation_percent)
    for path, reason in skipped:
        _warn_once(path, 'skipping %s: %s', path, reason)
    undecodable = [image for image in images if image.image_format not in onu_dataset.TF_DECODABLE_FORMATS]
    if undecodable:
        images = [image for image in images if image.image_format in onu_dataset.TF_DECODABLE_FORMATS]
        names = ', '.join(f'{onu_dataset.relative_name(image.path, data_dir)} ({image.image_format})'
                          for image in undecodable[:3])
        _warn_once(f'{split_dir}#undecodable', 'leaving out %d %s photo(s) that --data_format=images cannot decode '
                   '(%s%s); encoded and raw records include them (python convert_to_tfrecord.py)',
                   len(undecodable), split, names, ', ...' if len(undecodable) > 3 else '')
    if not images:
        if bare:
            raise onu_dataset.DataError(
                f'{data_dir}: no {split} photos among its class folders with --validation_percent='
                f'{validation_percent:g}; add photos or choose another --validation_percent')
        raise onu_dataset.DataError(
            f'{split_dir}: no readable images in the class folders; add photos to {split_dir}/<class>/')
    return DatasetInfo(
        data_dir=data_dir, data_format='images', split=split, class_names=tuple(class_names),
        num_examples=len(images), files=tuple(image.path for image in images),
        layout='class_folders' if bare else 'photos', labels=tuple(image.label for image in images),
        orientations=tuple(image.orientation for image in images), skipped=tuple(skipped),
        validation_percent=validation_percent if bare else None)


def _records_info(data_dir, data_format, split, validation_percent, labels_offset):
    """Returns the DatasetInfo of split from this repo's records manifest, checking the shards on disk."""
    records_dir = onu_dataset.records_dir_for(data_dir, data_format)
    manifest_path = os.path.join(records_dir, onu_dataset.MANIFEST_FILENAME)
    if not os.path.isfile(manifest_path):
        raise onu_dataset.DataError(
            f'{manifest_path} not found: no {data_format} records; write them with '
            f'{_convert_command(data_dir, data_format)}, or use --data_format=images')
    manifest = onu_dataset.read_manifest(records_dir)
    problem = _made_otherwise(data_dir, data_format, validation_percent, labels_offset)
    if problem:
        raise onu_dataset.DataError(problem)
    formats = manifest.get('splits', {}).get(split, {})
    if data_format not in formats:
        others = [fmt for fmt in onu_dataset.RECORD_FORMATS if fmt in formats]
        found = f'only {" and ".join(others)} records' if others else 'no records'
        instead = f', or use --data_format={others[0]}' if others else ''
        raise onu_dataset.DataError(
            f'{records_dir}: {data_format} records of {split} were asked but the manifest lists '
            f'{found}; write them with {_convert_command(data_dir, data_format)}{instead}')
    entry = onu_dataset.records_entry(manifest, split, data_format, records_dir)
    files = onu_dataset.shard_paths(records_dir, manifest, split, data_format)
    for path, shard in zip(files, entry['shards']):
        _check_shard(path, shard.get('bytes'), data_dir, data_format)
    labels_path = os.path.join(records_dir, onu_dataset.LABELS_FILENAME)
    if not os.path.isfile(labels_path):
        raise onu_dataset.DataError(
            f'{labels_path} not found: re-create the records with '
            f'{_convert_command(data_dir, data_format)} --overwrite')
    num_examples = int(entry['records'])
    if not num_examples:
        raise onu_dataset.DataError(
            f'{records_dir}: the manifest lists no {data_format} records of {split}; add photos to '
            f'{os.path.join(data_dir, split)}/<class>/ and run {_convert_command(data_dir, data_format)} '
            f'--overwrite')
    return DatasetInfo(
        data_dir=data_dir, data_format=data_format, split=split,
        class_names=tuple(onu_dataset.read_labels(labels_path)), num_examples=num_examples,
        files=tuple(files), layout='records', records_per_file=tuple(int(shard['records']) for shard in entry['shards']),
        compression_type=onu_dataset.tf_compression_type(manifest.get('compression', 'NONE')),
        bytes_per_example=int(entry.get('record_bytes', 0)) // max(num_examples, 1),
        image_key=onu_dataset.KEY_RAW if data_format == 'raw' else onu_dataset.KEY_ENCODED,
        validation_percent=manifest.get('validation_percent'),
        data_labels_offset=manifest.get('source', {}).get('labels_offset'))


def _other_tools_records_info(data_dir, data_format, split, labels_offset):
    """Returns the DatasetInfo of split from the records another tool wrote in data_dir (onu_layouts), read as they are."""
    record_set = onu_layouts.find_foreign_records(data_dir).record_set(split, data_format, labels_offset)
    if not record_set.num_examples:
        raise onu_dataset.DataError(f'{record_set.folder}: its {split} records are empty')
    return DatasetInfo(
        data_dir=data_dir, data_format=data_format, split=split, class_names=record_set.labels.class_names,
        num_examples=record_set.num_examples, files=record_set.files, layout=record_set.layout,
        records_per_file=record_set.records_per_file,
        compression_type=onu_dataset.tf_compression_type(record_set.compression),
        bytes_per_example=record_set.record_bytes // record_set.num_examples, image_key=record_set.image_key,
        label_key=record_set.label_key, filename_key=record_set.filename_key,
        labels_offset=record_set.labels.offset, data_labels_offset=record_set.labels.offset)


def describe_labels(data_dir, labels_offset=None):
    """Returns one line on how another tool's records in data_dir are labelled ('' for photos and this repo's records)."""
    foreign = onu_layouts.find_foreign_records(data_dir)
    if foreign is None:
        return ''
    labels = foreign.labels(labels_offset)
    return (f'{foreign.describe()}; labels start at {labels.offset} ({labels.evidence}); '
            f'class names from {labels.names_from}')


def _check_shard(path, expected_bytes, data_dir, data_format):
    """Raises DataError when a shard listed in the manifest is missing or has another size."""
    fix = f're-create the records with {_convert_command(data_dir, data_format)} --overwrite'
    if not os.path.isfile(path):
        raise onu_dataset.DataError(f'{path}: record file listed in the manifest is missing; {fix}')
    size = os.path.getsize(path)
    if expected_bytes is not None and size != expected_bytes:
        raise onu_dataset.DataError(
            f'{path}: {size} bytes on disk but {expected_bytes} in the manifest (truncated or '
            f'changed); {fix}')


# ----------------------------------------------------------------------------------------------
# Decoding and preprocessing: one image at a time, usable in tf.data maps and tf.map_fn.

def decode_image_bytes(encoded, at_least=None):
    """Returns the uint8 [height, width, 3] RGB image of JPEG/PNG/GIF/BMP bytes.

    at_least: None decodes exactly, at full size. A side length lets a JPEG decode at the smallest
    DCT scale (1/2, 1/4, 1/8) whose shorter side still has at least that many pixels: much less
    work, slightly different pixels, so only training uses it.
    """
    if at_least is None:
        # INTEGER_ACCURATE is the IDCT Pillow uses, so encoded records and files match raw records
        # exactly; TensorFlow's default (INTEGER_FAST) is about 1/255 off on average.
        jpeg = lambda: tf.io.decode_jpeg(encoded, channels=3, dct_method='INTEGER_ACCURATE')  # noqa: E731
    else:
        jpeg = lambda: _decode_jpeg_reduced(encoded, at_least)  # noqa: E731
    image = tf.cond(tf.io.is_jpeg(encoded), jpeg,
                    lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False))
    image.set_shape([None, None, 3])
    return image


def _decode_jpeg_reduced(encoded, at_least):
    """Returns the JPEG decoded at the smallest DCT scale that keeps at_least pixels on its shorter side."""
    shape = tf.io.extract_jpeg_shape(encoded)  # reads the header only
    shorter = tf.minimum(shape[0], shape[1])
    # libjpeg gives ceil(side / ratio) pixels; the ratios that still cover at_least are a prefix.
    usable = [tf.cast((shorter + ratio - 1) // ratio >= at_least, tf.int32) for ratio in DCT_RATIOS[1:]]
    return tf.switch_case(tf.add_n(usable), [
        functools.partial(tf.io.decode_jpeg, encoded, channels=3, ratio=ratio) for ratio in DCT_RATIOS])


def apply_exif_orientation(image, orientation):
    """Returns image turned upright for its EXIF orientation (1-8), as PIL's exif_transpose does."""
    def transpose():
        return tf.transpose(image, [1, 0, 2])
    upright = [
        lambda: image,                               # 1: upright already (and unknown values)
        lambda: tf.image.flip_left_right(image),     # 2: mirrored
        lambda: tf.image.rot90(image, 2),            # 3: upside down
        lambda: tf.image.flip_up_down(image),        # 4: mirrored upside down
        transpose,                                   # 5: mirrored along the main diagonal
        lambda: tf.image.rot90(image, 3),            # 6: needs a quarter turn clockwise
        lambda: tf.image.rot90(transpose(), 2),      # 7: mirrored along the other diagonal
        lambda: tf.image.rot90(image, 1),            # 8: needs a quarter turn counterclockwise
    ]
    orientation = tf.cast(orientation, tf.int32)
    index = tf.where((orientation >= 1) & (orientation <= 8), orientation - 1, 0)
    return tf.switch_case(index, upright)


def to_unit_range(image, image_size):
    """Returns the uint8 image resized to [image_size, image_size, 3] float32 in [0, 1]."""
    image = tf.convert_to_tensor(image)
    if image.dtype != tf.uint8:
        raise ValueError(f'expected a uint8 image, got {image.dtype.name}')
    # resize returns float32 in [0, 255] whatever it is given, so scale explicitly here:
    # convert_image_dtype after resize would see float input and scale nothing (the study's bug).
    resized = tf.image.resize(image, [image_size, image_size], method='bilinear')
    return resized * (1.0 / 255.0)


def to_model_range(image):
    """Returns an image in [0, 1] mapped to the model's input range [-1, 1]."""
    return image * 2.0 - 1.0


def preprocess_for_eval(image, image_size):
    """Returns the uint8 [h, w, 3] image as the model sees it: [size, size, 3] float32 in [-1, 1]."""
    return to_model_range(to_unit_range(image, image_size))


def resize_for_training(image, image_size):
    """Returns the uint8 [h, w, 3] image resized to uint8 [image_size, image_size, 3]."""
    resized = tf.image.resize(image, [image_size, image_size], method='bilinear')
    # uint8 is what the pipeline hands over: a quarter of float32's bytes to batch, copy and cache.
    return tf.cast(tf.round(tf.clip_by_value(resized, 0.0, 255.0)), tf.uint8)


# ----------------------------------------------------------------------------------------------
# Training augmentation: one op graph over the whole batch, per-image parameters.

def _per_pixel(parameters):
    """Returns [batch] parameters as [batch, 1, 1, 1], to apply to every pixel of each image."""
    return parameters[:, tf.newaxis, tf.newaxis, tf.newaxis]


def _stream_seed(seed, augmentation):
    """Returns the [2] seed of augmentation's draws for a batch's [2] int seed: its own stream."""
    return tf.random.experimental.stateless_fold_in(seed, tf.constant(augmentation.stream, tf.int64))


def random_draws(seed, batch_size):
    """Returns [batch_size, NUM_DRAWS] uniform draws in [0, 1) for a [2] int seed: one row per image, one column
    per augmentation of AUGMENTATIONS, each from its own stream, so adding one leaves the others' draws as they are."""
    return tf.stack([tf.random.stateless_uniform([batch_size], seed=_stream_seed(seed, augmentation),
                                                 minval=0.0, maxval=1.0)
                     for augmentation in AUGMENTATIONS], axis=1)


def distortion_params(draws):
    """Returns the augmentation parameters of [batch, NUM_DRAWS] draws: {name: [batch] in its [low, high]}."""
    return {augmentation.name: augmentation.low + (augmentation.high - augmentation.low) * draws[:, column]
            for column, augmentation in enumerate(AUGMENTATIONS)}


def rotation_transforms(angles, height, width):
    """Returns [batch, 8] ImageProjectiveTransform rows rotating each image by its angle about its centre.

    Each row maps an output pixel (x, y) to the input point it samples:
    input = centre + R(angle) (output - centre).
    """
    cos, sin = tf.cos(angles), tf.sin(angles)
    centre_x, centre_y = (width - 1.0) / 2.0, (height - 1.0) / 2.0
    zeros = tf.zeros_like(angles)
    return tf.stack([cos, -sin, centre_x - cos * centre_x + sin * centre_y,
                     sin, cos, centre_y - sin * centre_x - cos * centre_y, zeros, zeros], axis=1)


def _rotate_batch(images, angles):
    """Returns uint8 [b, h, w, 3] images rotated by angles as float [0, 1], and the covered share per pixel.

    Bilinear, as ImageProjectiveTransformV3, but the sample position is computed once per pixel
    (that op computes it once per channel) and all four neighbours are gathered as RGB rows. A
    neighbour outside the image contributes nothing to the content; `covered` ([b, h, w, 1], 0-1)
    is the weight of the neighbours inside, so the caller blends in the fill after the colour ops.
    """
    shape = tf.shape(images)
    batch, height, width = shape[0], shape[1], shape[2]
    transforms = rotation_transforms(angles, tf.cast(height, tf.float32), tf.cast(width, tf.float32))
    rows, columns = tf.meshgrid(tf.range(tf.cast(height, tf.float32)),
                                tf.range(tf.cast(width, tf.float32)), indexing='ij')

    def coefficient(index):
        return transforms[:, index][:, tf.newaxis, tf.newaxis]
    x = coefficient(0) * columns + coefficient(1) * rows + coefficient(2)
    y = coefficient(3) * columns + coefficient(4) * rows + coefficient(5)
    x_floor, y_floor = tf.floor(x), tf.floor(y)
    x_frac, y_frac = x - x_floor, y - y_floor
    x_floor, y_floor = tf.cast(x_floor, tf.int32), tf.cast(y_floor, tf.int32)
    pixels = tf.reshape(images, [-1, 3])
    first_pixel = (tf.range(batch) * height * width)[:, tf.newaxis, tf.newaxis]

    def neighbour(row, column, weight):
        inside = (column >= 0) & (column < width) & (row >= 0) & (row < height)
        index = (first_pixel + tf.clip_by_value(row, 0, height - 1) * width
                 + tf.clip_by_value(column, 0, width - 1))
        weight = tf.where(inside, weight, 0.0)
        return tf.cast(tf.gather(pixels, index), tf.float32) * weight[..., tf.newaxis], weight
    neighbours = [neighbour(y_floor, x_floor, (1.0 - x_frac) * (1.0 - y_frac)),
                  neighbour(y_floor, x_floor + 1, x_frac * (1.0 - y_frac)),
                  neighbour(y_floor + 1, x_floor, (1.0 - x_frac) * y_frac),
                  neighbour(y_floor + 1, x_floor + 1, x_frac * y_frac)]
    covered = tf.add_n([weight for _, weight in neighbours])[..., tf.newaxis]
    content = tf.add_n([value for value, _ in neighbours]) / (255.0 * tf.maximum(covered, 1e-6))
    return content, covered


def _rotate(images, covered, angles):
    """The rotation's op (geometry): uint8 images turned about their centres by their angles (radians), bilinear."""
    if images.dtype != tf.uint8:
        raise ValueError('rotation resamples the uint8 batch: register it before augmentations that resample')
    return _rotate_batch(images, angles)


def _scale_saturation(channels, weight, factors):
    """The saturation's op (hsv): each image's saturation times its factor, at most 1."""
    return dict(channels, saturation=tf.clip_by_value(channels['saturation'] * factors[:, tf.newaxis, tf.newaxis],
                                                      0.0, 1.0))


def _shift_hue(channels, weight, deltas):
    """The hue's op (hsv): each image's hues turned by its delta, a share of the colour circle."""
    return dict(channels, hue=tf.math.floormod(channels['hue'] + deltas[:, tf.newaxis, tf.newaxis], 1.0))


def _shift_brightness(images, weight, deltas):
    """The brightness's op (rgb): each image plus its delta."""
    return images + _per_pixel(deltas)


def _scale_contrast(images, weight, factors):
    """The contrast's op (rgb): each channel's distance from its mean over the photo's pixels times the factor."""
    # tf.image.adjust_contrast's rule; weighted, so the mean leaves out what a rotation uncovered.
    mean = tf.reduce_sum(images * weight, [1, 2], keepdims=True) / tf.reduce_sum(weight, [1, 2], keepdims=True)
    return (images - mean) * _per_pixel(factors) + mean


# The training augmentations, in --augmentations' order. A new one is an entry here: the flag, AugmentOptions,
# the draws (a column each, from its own seed stream) and the tests follow from it; benchmark_baselines says in
# one line that it needs its own version there.
AUGMENTATIONS = (
    Augmentation('saturation', 0.8, 1.2, 'hsv', _scale_saturation),  # factor
    Augmentation('brightness', -32.0 / 255.0, 32.0 / 255.0, 'rgb', _shift_brightness),  # delta on [0, 1]
    Augmentation('contrast', 0.8, 1.2, 'rgb', _scale_contrast),  # factor
    Augmentation('hue', -0.2, 0.2, 'hsv', _shift_hue),  # share of the colour circle
    Augmentation('rotation', -math.radians(10.0), math.radians(10.0), 'geometry', _rotate),  # radians
)
NUM_DRAWS = len(AUGMENTATIONS)  # uniform draws per image: one per augmentation


def _augment_batch(images, draws, options):
    """augment_batch's computation, for one AugmentOptions."""
    params = distortion_params(draws)
    applied = {space: [augmentation for augmentation in AUGMENTATIONS
                       if augmentation.space == space and augmentation.name in options.names]
               for space in AUGMENTATION_SPACES}
    # Geometry first: the colour ops are per pixel, so they commute with the resampling, and they then
    # run on the pixels the model sees (the fill stays exactly grey).
    covered = None
    for augmentation in applied['geometry']:
        images, covered = augmentation.apply(images, covered, params[augmentation.name])
    if images.dtype == tf.uint8:
        images = tf.cast(images, tf.float32) * (1.0 / 255.0)
    weight = tf.ones_like(images[..., :1]) if covered is None else covered
    if applied['hsv']:
        channels = dict(zip(HSV_CHANNELS, tf.unstack(tf.image.rgb_to_hsv(images), axis=-1)))
        for augmentation in applied['hsv']:
            channels = augmentation.apply(channels, weight, params[augmentation.name])
        images = tf.image.hsv_to_rgb(tf.stack([channels[name] for name in HSV_CHANNELS], axis=-1))
    for augmentation in applied['rgb']:
        images = augmentation.apply(images, weight, params[augmentation.name])
    if covered is not None:
        images = images * covered + ROTATION_FILL_VALUE * (1.0 - covered)
    return to_model_range(tf.clip_by_value(images, 0.0, 1.0))


@functools.lru_cache(maxsize=None)
def _compiled_augmentation(options):
    """Returns _augment_batch for options as one XLA-compiled function (CPU or GPU alike)."""
    # XLA fuses the dozen per-pixel steps into a few loops over the batch: on CPU about 3x less
    # time than running them as separate TensorFlow kernels, each of which reads and writes the batch.
    return tf.function(lambda images, draws: _augment_batch(images, draws, options), jit_compile=True)


def augment_batch(images, draws, augment=True):
    """Returns uint8 [batch, size, size, 3] images augmented per image by their draws: float32 in [-1, 1].

    draws: [batch, NUM_DRAWS] uniform in [0, 1) (random_draws), one row of parameters per image.
    The same function runs in the input pipeline (--augment_on=input) and on the model's device
    (--augment_on=model), so both give the same images for the same draws.
    """
    images = tf.convert_to_tensor(images)
    if images.dtype != tf.uint8:
        raise ValueError(f'expected uint8 images, got {images.dtype.name}')
    return _compiled_augmentation(AugmentOptions.of(augment))(images, tf.cast(draws, tf.float32))


def add_input_summary(images):
    """Adds an image summary of the first few [-1, 1] training images."""
    shown = tf.image.convert_image_dtype((images[:NUM_SUMMARY_IMAGES] + 1.0) / 2.0, tf.uint8, saturate=True)
    tf.compat.v1.summary.image('augmented_inputs', shown, max_outputs=NUM_SUMMARY_IMAGES)


# ----------------------------------------------------------------------------------------------
# Images mode. Each epoch is a stream of positions 0..n-1; position p of epoch e reads the file
# _file_order(...)(e, p): the listing's order for eval, a fresh permutation each epoch for training.
# A file that fails to decode is dropped; the gap it leaves in the positions names it, so it is
# reported (once) and counted, never silently.

_decode_failures = {}
_decode_failures_lock = threading.Lock()


def decode_failures():
    """Returns {path: reason} of the image files that failed to decode (and were skipped) so far."""
    with _decode_failures_lock:
        return dict(_decode_failures)


def _decode_error_reason(path):
    """Returns why the file at path cannot be used, in one line."""
    try:
        with open(path, 'rb') as f:
            decode_image_bytes(tf.constant(f.read()))
    except OSError as e:
        return f'unreadable ({e.strerror})'
    except tf.errors.OpError as e:
        return f'cannot be decoded ({_last_line(e.message)})'
    return 'cannot be decoded'


def _note_decode_failure(path):
    """Records that path was skipped and warns about it the first time."""
    with _decode_failures_lock:
        if path in _decode_failures:
            return
    reason = _decode_error_reason(path)
    with _decode_failures_lock:
        _decode_failures[path] = reason
        count = len(_decode_failures)
    logging.warning('skipping %s: %s; fix or remove it (%d image file(s) skipped so far)',
                    path, reason, count)


def _check_some_image_decodes(info):
    """DataError when every image file of info has failed to decode: training would wait for a batch forever."""
    failures = decode_failures()
    if all(path in failures for path in info.files):
        raise onu_dataset.DataError(
            f'{os.path.join(info.data_dir, info.split)}: none of the {len(info.files)} images decodes; '
            f'replace them with JPEG/PNG/GIF/BMP photos')


def _photo_reader(info, at_least):
    """Returns read(index) -> (upright uint8 image, int32 label) of image file `index` of info (at_least:
    decode_image_bytes's)."""
    paths = tf.constant(info.files)
    labels = tf.constant(info.labels, tf.int32)
    orientations = tf.constant(info.orientations, tf.int32)

    def read(index):
        image = decode_image_bytes(tf.io.read_file(paths[index]), at_least)
        return apply_exif_orientation(image, orientations[index]), labels[index]
    return read


def _file_order(num_files, training, seed):
    """Returns (epoch, position) -> file index: the listing's order, or a permutation per epoch."""
    if not training:
        return lambda epoch, position: position
    order_seed = seed if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])

    def file_index(epoch, position):
        epoch_seed = tf.stack([tf.constant(order_seed, tf.int64), tf.cast(epoch, tf.int64)])
        return tf.random.experimental.index_shuffle(position, epoch_seed, num_files - 1)
    return file_index


def _decoded_files(info, training, seed, at_least=None, repeat=True):
    """Returns a dataset of (uint8 image, int32 label, file name) from the image files of info.

    The file name is relative to the data dir, as records store it (onu_dataset.KEY_FILENAME).
    at_least: decode JPEGs at a reduced scale down to this side (decode_image_bytes); repeat: a new
    permutation per epoch forever (training), else one epoch.
    """
    num_files = len(info.files)
    names = tf.constant([onu_dataset.relative_name(path, info.data_dir) for path in info.files])
    read_photo = _photo_reader(info, at_least)
    file_index = _file_order(num_files, training, seed)

    def report_skipped(epoch, first, end):
        for position in range(int(first), int(end)):
            index = file_index(epoch, tf.constant(position, tf.int64))
            _note_decode_failure(info.files[int(index)])
        if training:  # else it would spin forever
            _check_some_image_decodes(info)
        return end

    def one_epoch(epoch):
        def read(position):
            index = file_index(epoch, position)
            return (position,) + read_photo(index) + (names[index],)

        def skip_gap(expected, example):
            position, image, label, name = example
            position = tf.cond(
                position > expected,
                lambda: tf.py_function(report_skipped, [epoch, expected, position], tf.int64),
                lambda: position)
            return position + 1, (image, label, name)

        # deterministic: the positions must stay in order for the gaps to name skipped files.
        examples = tf.data.Dataset.range(num_files).map(
            read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        examples = examples.ignore_errors()  # not silent: skip_gap reports each dropped file
        # An end marker, so that failures among the last files leave a gap too.
        examples = examples.concatenate(tf.data.Dataset.from_tensors(
            (np.int64(num_files), tf.zeros([0, 0, 3], tf.uint8), np.int32(-1), '')))
        return examples.scan(np.int64(0), skip_gap).filter(lambda image, label, name: label >= 0)

    if not repeat:
        return one_epoch(np.int64(0))
    return tf.data.Dataset.counter().flat_map(one_epoch)


# ----------------------------------------------------------------------------------------------
# Record modes.

def _raw_pixels(features, image_key):
    """Returns the uint8 [h, w, 3] image of a raw record: 1 byte per pixel is grey, 4 is RGBA (alpha dropped).

    The channels come from the byte count (onu_layouts checked it fits height x width x 1, 3 or 4).
    """
    height, width = features[onu_dataset.KEY_HEIGHT], features[onu_dataset.KEY_WIDTH]
    pixels = tf.io.decode_raw(features[image_key], tf.uint8)
    channels = tf.size(pixels, out_type=tf.int64) // tf.maximum(height * width, 1)
    image = tf.reshape(pixels, tf.stack([height, width, channels]))
    # Index 0: grey, replicated as Pillow's convert('RGB') does; 1: RGB as it is; 2: RGBA without its alpha.
    image = tf.switch_case(tf.cast(tf.minimum(channels // 2, 2), tf.int32), [
        lambda: tf.tile(image, [1, 1, 3]), lambda: image, lambda: image[:, :, :3]])
    return tf.ensure_shape(image, [None, None, 3])


def _parse_record(serialized, info, at_least=None, record_name=''):
    """Returns (uint8 image, int32 class, file name) of one record of info (at_least: decode_image_bytes's).

    The keys are info's (this repo's, or those another tool wrote); class = stored label - info.labels_offset,
    checked to be one of the classes (a LABEL_OUT_OF_RANGE error otherwise). A record that names no file
    is named record_name.
    """
    spec = {info.image_key: tf.io.FixedLenFeature([], tf.string),
            info.label_key: tf.io.FixedLenFeature([], tf.int64)}
    if info.filename_key:
        spec[info.filename_key] = tf.io.FixedLenFeature([], tf.string, default_value='')
    if info.data_format == 'raw':
        spec.update({key: tf.io.FixedLenFeature([], tf.int64) for key in (onu_dataset.KEY_HEIGHT, onu_dataset.KEY_WIDTH)})
    features = tf.io.parse_single_example(serialized, spec)
    if info.data_format == 'raw':
        image = _raw_pixels(features, info.image_key)
    else:
        image = decode_image_bytes(features[info.image_key], at_least)
    stored = features[info.label_key]
    in_range = tf.debugging.Assert(
        (stored >= info.labels_offset) & (stored < info.labels_offset + info.num_classes),
        [LABEL_OUT_OF_RANGE, stored])
    with tf.control_dependencies([in_range]):
        label = tf.cast(stored - info.labels_offset, tf.int32)
    name = features[info.filename_key] if info.filename_key else tf.constant('')
    return image, label, tf.where(tf.equal(name, ''), record_name, name)


def _shuffle_buffer_size(info):
    """Returns how many records to shuffle in memory: SHUFFLE_BUFFER_BYTES worth, at most all."""
    by_memory = SHUFFLE_BUFFER_BYTES // max(info.bytes_per_example, 1)
    return max(1, min(info.num_examples, MAX_SHUFFLE_BUFFER, by_memory))


def _decoded_records(info, training, seed, deterministic, at_least=None, repeat=True):
    """Returns a dataset of (uint8 image, int32 label, file name) from the record shards of info.

    Training interleaves the shards in a shuffled order (a new one each epoch; forever when
    repeat) and shuffles records in a buffer; eval reads the shards one after the other, in the
    manifest's order. at_least: decode_image_bytes's.
    """
    if training:
        files = tf.data.Dataset.from_tensor_slices(list(info.files))
        files = files.shuffle(len(info.files), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            files = files.repeat()
        records = files.interleave(
            lambda path: tf.data.TFRecordDataset(path, compression_type=info.compression_type),
            cycle_length=min(len(info.files), 8), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic)
        records = records.shuffle(_shuffle_buffer_size(info), seed=seed)
        return records.map(lambda record: _parse_record(record, info, at_least),
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    def named_records(path):
        """The records of one shard, each with the name <shard>#<index> for records that name no file."""
        shard = tf.strings.regex_replace(path, '^.*/', '')
        return tf.data.TFRecordDataset(path, compression_type=info.compression_type).enumerate().map(
            lambda index, record: (record, tf.strings.join([shard, onu_dataset.RECORD_NAME_SEPARATOR, tf.strings.as_string(index)])))
    records = tf.data.Dataset.from_tensor_slices(list(info.files)).flat_map(named_records)
    return records.map(lambda record, name: _parse_record(record, info, at_least, name),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)


# ----------------------------------------------------------------------------------------------
# Pipelines.

def decoded_epoch_bytes(num_examples, image_size):
    """Returns the bytes one epoch of num_examples resized uint8 training images takes in memory."""
    return num_examples * image_size * image_size * 3


def uses_decoded_cache(info, image_size, cache=None):
    """Returns whether training keeps the decoded epoch in memory: cache, or (None) when it fits DECODED_CACHE_BYTES."""
    return decoded_epoch_bytes(info.num_examples, image_size) <= DECODED_CACHE_BYTES if cache is None else bool(cache)


def _cache_fill_progress(num_examples):
    """Returns a function (for tf.numpy_function) that counts the examples decoded into the cache on a progress bar,
    shown from the first of them on."""
    bars = []

    def tick():
        if not bars:
            bars.append(tqdm(total=num_examples, unit='photo', desc='decoding the first epoch into memory',
                             leave=False))
        bars[0].update()
        if bars[0].n >= num_examples:
            bars[0].close()
        return np.int64(bars[0].n)
    return tick


def _training_examples(info, image_size, seed, deterministic, cache, reduced_decode, cache_progress=False):
    """Returns an endless shuffled dataset of (uint8 [size, size, 3] image, label) for training.

    cache: decode one epoch, keep it in memory and reshuffle it every epoch, instead of reading and
    decoding every epoch (the epoch is the shuffle buffer, so the first batch waits for all of it;
    cache_progress: show that on a progress bar). reduced_decode: decode JPEGs at a reduced DCT scale
    (decode_image_bytes).
    """
    repeat = not cache
    at_least = image_size if reduced_decode else None
    if info.data_format == 'images':
        examples = _decoded_files(info, True, seed, at_least=at_least, repeat=repeat)
    else:
        examples = _decoded_records(info, True, seed, deterministic, at_least=at_least, repeat=repeat)
    examples = examples.map(lambda image, label, name: (resize_for_training(image, image_size), label),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if cache:
        if cache_progress:  # before the cache: each example passes here once, while the first epoch is decoded
            tick = _cache_fill_progress(info.num_examples)

            def counted(image, label):
                with tf.control_dependencies([tf.numpy_function(tick, [], tf.int64, stateful=True)]):
                    return tf.identity(image), label
            examples = examples.map(counted)
        examples = examples.cache().shuffle(info.num_examples, seed=seed,
                                            reshuffle_each_iteration=True).repeat()
    return examples


def make_dataset(info, batch_size, image_size, training, augment=True, seed=None,
                 augment_on='input', cache=None, reduced_decode=False, with_filenames=False, cache_progress=False,
                 data_service=None, service_job=None):
    """Returns a tf.data.Dataset of batches for the split described by info.

    training: shuffle, repeat forever, drop the final partial batch, and give each image its
    augmentation draws. With augment_on='input' the batches are augmented here: (images, labels);
    with 'model' they are (uint8 images, labels, draws) for augment_batch on the model's device.
    cache: keep the decoded epoch in memory (None: uses_decoded_cache decides; cache_progress: a progress
    bar while the first epoch is decoded). reduced_decode: decode JPEGs
    at a reduced DCT scale: cheaper, but the pixels differ from eval's (see README).
    Otherwise read each example once in order, eval preprocessing, keep the partial batch;
    with_filenames: (images, labels, file names relative to the data dir).
    seed: makes the order and the augmentations reproducible. data_service: grpc://HOST:PORT of a tf.data service
    whose workers make the training batches (_service_batches; service_job: its job's name, None for this
    trainer's own); cache must not be True then.
    """
    if batch_size < 1 or image_size < 1:
        raise ValueError(f'batch_size={batch_size} and image_size={image_size} must be positive')
    _check_choice('augment_on', augment_on, AUGMENT_PLACEMENTS)
    deterministic = not training or seed is not None
    if not training:
        if info.data_format == 'images':
            examples = _decoded_files(info, training, seed, repeat=False)
        else:
            examples = _decoded_records(info, training, seed, deterministic)

        def preprocessed(image, label, name):
            example = (preprocess_for_eval(image, image_size), label)
            return example + (name,) if with_filenames else example
        examples = examples.map(preprocessed, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        return examples.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    if data_service:
        if cache:
            raise ValueError('the decoded-epoch cache is local: not with a tf.data service')
        return _service_batches(info, batch_size, image_size, seed, reduced_decode, AugmentOptions.of(augment),
                                augment_on, data_service, service_job)
    cache = uses_decoded_cache(info, image_size, cache)
    batches = _training_examples(info, image_size, seed, deterministic, cache, reduced_decode,
                                 cache_progress).batch(batch_size, drop_remainder=True)
    options = AugmentOptions.of(augment)

    def with_draws(batch, batch_seed):
        images, labels = batch
        draws = random_draws(batch_seed, batch_size)
        if augment_on == 'model':
            return images, labels, draws
        return augment_batch(images, draws, options), labels
    seeds = tf.data.Dataset.random(seed=seed).batch(2)
    batches = tf.data.Dataset.zip((batches, seeds)).map(
        with_draws, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    return batches.prefetch(tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------------------------
# The tf.data service: the same batches, made by the service's workers.

SERVICE_CYCLE_LENGTH = 8       # photos or shards a service worker reads at once
MAX_RECORDS_PER_SHARD = 2**24  # an example's key is shard draw * this + its index in the shard


def _decoded_or_failed(read_photo, index, image_size):
    """Returns a one-element dataset: (resized uint8 image, label) of photo `index` (read_photo: _photo_reader's),
    or, when it cannot be read or decoded, (zeros, -1 - index): a failure the trainer reports (_reported_failures)."""
    def read(index):
        image, label = read_photo(index)
        return resize_for_training(image, image_size), label
    decoded = tf.data.Dataset.from_tensors(index).map(read).ignore_errors()  # a try with no py_function
    failed = tf.data.Dataset.from_tensors((tf.zeros([image_size, image_size, 3], tf.uint8),
                                           tf.cast(-1 - index, tf.int32)))
    return decoded.concatenate(failed).take(1)


def _service_examples(info, image_size, seed, reduced_decode):
    """Returns the endless dataset of (resized uint8 image, label, example key) the service's workers make.

    Its source is a counter of draws of units (photos in images mode, shards in record modes), each epoch's
    draws a new permutation of all units (_file_order): the dispatcher hands the draws out one at a time
    (processing mode distributed_epoch), so every unit goes to one worker once per epoch. The key, unique
    to an example and a draw, seeds the batch's augmentation (all workers run the same graph and seed).
    """
    num_units, at_least = len(info.files), (image_size if reduced_decode else None)
    unit_index = _file_order(num_units, True, seed)
    draws = tf.data.Dataset.counter().map(lambda draw: (draw, unit_index(draw // num_units, draw % num_units)))
    if info.data_format == 'images':
        read_photo = _photo_reader(info, at_least)

        def unit(draw, index):
            return _decoded_or_failed(read_photo, index, image_size).map(lambda image, label: (image, label, draw))
        return draws.interleave(unit, cycle_length=SERVICE_CYCLE_LENGTH, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=False)

    def shard(draw, index):
        records = tf.data.TFRecordDataset(tf.gather(info.files, index), compression_type=info.compression_type)
        return records.enumerate().map(lambda position, record: (record, draw * MAX_RECORDS_PER_SHARD + position))
    records = draws.interleave(shard, cycle_length=min(num_units, SERVICE_CYCLE_LENGTH),
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    records = records.shuffle(_shuffle_buffer_size(info), seed=seed)

    def example(record, key):
        image, label, _ = _parse_record(record, info, at_least)
        return resize_for_training(image, image_size), label, key
    return records.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def _reported_failures(info, batches, batch_size):
    """Returns batches without the photos the service's workers could not decode (label -1 - index), each reported
    here, on the trainer (once, as local training does), and batched again to batch_size."""
    def kept(label):
        def report(label):
            _note_decode_failure(info.files[-1 - int(label)])
            _check_some_image_decodes(info)  # else it would wait for a batch forever
            return False
        return tf.cond(label >= 0, lambda: True,
                       lambda: tf.numpy_function(report, [label], tf.bool, stateful=True))
    examples = batches.unbatch().filter(lambda image, label, *draws: kept(label))
    return examples.batch(batch_size, drop_remainder=True)


def _quantized(images):
    """Returns augmented [-1, 1] images as uint8 for the network: a quarter of float32's bytes to send and receive
    (at 299x299 that was most of the trainer's CPU per image), within half a grey level of them."""
    return tf.cast(tf.round((tf.clip_by_value(images, -1.0, 1.0) + 1.0) * 127.5), tf.uint8)


def _dequantized(images):
    """Returns _quantized images in the model's range [-1, 1] again."""
    return tf.cast(images, tf.float32) * (1.0 / 127.5) - 1.0


def _service_batches(info, batch_size, image_size, seed, reduced_decode, options, augment_on, data_service,
                     service_job):
    """Returns make_dataset's training batches, made by the tf.data service at data_service (grpc://HOST:PORT).

    The workers read, decode, resize, batch, draw and (augment_on='input') augment; the trainer receives uint8
    batches: augmented and rounded to uint8 (_quantized), or resized with their draws for augment_on='model'. service_job: the name of the job trainers
    share (one epoch among them: a cluster's workers), None for this trainer's own. No decoded-epoch cache
    (a worker sees only its share of each epoch), and nothing a worker cannot run (no py_function).
    """
    seed = 0 if seed is None else seed
    examples = _service_examples(info, image_size, seed, reduced_decode)

    def with_draws(images, labels, keys):
        draws = random_draws(tf.stack([tf.constant(seed, tf.int64), keys[0]]), batch_size)
        if augment_on == 'model':
            return images, labels, draws
        return _quantized(augment_batch(images, draws, options)), labels
    batches = examples.batch(batch_size, drop_remainder=True).map(with_draws, num_parallel_calls=tf.data.AUTOTUNE,
                                                                  deterministic=False)
    with warnings.catch_warnings():  # distribute() reads the dataset's options, which graph mode warns about
        warnings.filterwarnings('ignore', 'To make it possible to preserve tf.data options', UserWarning)
        batches = batches.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=data_service,
            job_name=service_job))
    if info.data_format == 'images':
        batches = _reported_failures(info, batches, batch_size)
    if augment_on == 'input':
        batches = batches.map(lambda images, labels: (_dequantized(images), labels))
    return batches.prefetch(tf.data.AUTOTUNE)


# Graph collection of the ops that serialize each input iterator's tf.data model (next_batch): its nodes'
# processing times, the work the pipeline has done so far (pipeline_work).
PIPELINE_MODEL_OPS = 'onu_input_pipeline_models'


def next_batch(dataset):
    """Returns the tensors of a one-shot iterator over dataset (its tf.data model's op goes to PIPELINE_MODEL_OPS)."""
    iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    # pylint: disable=protected-access  (the v1 iterator's resource: the one handle to its tf.data model)
    tf.compat.v1.add_to_collection(PIPELINE_MODEL_OPS,
                                   tf.raw_ops.IteratorGetModelProto(iterator=iterator._iterator_resource))
    return iterator.get_next()


def pipeline_work(serialized_models):
    """Returns (seconds of work the input pipelines' nodes have done, batches produced) from their serialized tf.data
    models (the values of PIPELINE_MODEL_OPS): tf.data's own account, summed over its threads and pipelines."""
    seconds, batches = 0.0, 0
    for serialized in serialized_models:
        model = model_pb2.ModelProto.FromString(serialized)
        seconds += sum(node.processing_time for node in model.nodes.values()) / 1e9
        if model.output in model.nodes:
            batches = max(batches, model.nodes[model.output].num_elements)
    return seconds, batches


def distorted_inputs(info, batch_size, image_size, augment=True, seed=None, summaries=True, augment_on='input',
                     cache=None, reduced_decode=False, cache_progress=False, data_service=None, service_job=None):
    """Returns training (images, labels) of info (a train DatasetInfo): shuffled, repeated, augmented, static batch.

    augment: True, False or AugmentOptions. summaries: add an image summary of a few inputs.
    augment_on='model': the pipeline stops at resized uint8 images, which are augmented here in the
    caller's device scope (the model's) by the same augment_batch. cache, reduced_decode, cache_progress,
    data_service, service_job: make_dataset's.
    """
    pipeline = dict(seed=seed, cache=cache, reduced_decode=reduced_decode, cache_progress=cache_progress,
                    data_service=data_service, service_job=service_job)
    if augment_on == 'model':
        images, labels, draws = undistorted_inputs(info, batch_size, image_size, **pipeline)
        images = augment_batch(images, draws, augment)
    else:
        with tf.device(PIPELINE_DEVICE):
            images, labels = next_batch(make_dataset(info, batch_size, image_size, training=True, augment=augment,
                                                     **pipeline))
    if summaries:
        add_input_summary(images)
    return images, labels


def undistorted_inputs(info, batch_size, image_size, seed=None, cache=None, reduced_decode=False,
                       cache_progress=False, data_service=None, service_job=None):
    """Returns training (uint8 images, labels, draws) of info: resized, not augmented, for augment_batch."""
    with tf.device(PIPELINE_DEVICE):
        return next_batch(make_dataset(info, batch_size, image_size, training=True, seed=seed,
                                        augment_on='model', cache=cache, reduced_decode=reduced_decode,
                                        cache_progress=cache_progress, data_service=data_service,
                                        service_job=service_job))


def inputs(info, batch_size, image_size, with_filenames=False):
    """Returns eval (images, labels) of info's split, each example once, then OutOfRangeError.

    The final batch may be smaller, so the batch dimension is None. with_filenames: (images,
    labels, file names relative to the data dir, or <shard>#<index> for records that name none).
    """
    with tf.device(PIPELINE_DEVICE):
        return next_batch(make_dataset(info, batch_size, image_size, training=False,
                                        with_filenames=with_filenames))


# ----------------------------------------------------------------------------------------------
# Damaged records: a DataLossError surfaces at sess.run time; name the shard instead.

def _last_line(message):
    """Returns the last non-empty line of a TensorFlow error message, minus node annotations."""
    lines = [line.strip() for line in str(message).splitlines()
             if line.strip() and not line.strip().startswith('[[')]
    return lines[-1] if lines else str(message).strip()


def find_damaged_shards(info):
    """Returns [(shard, problem)] for the shards of info that fail to read or hold a wrong count."""
    damaged = []
    with tf.Graph().as_default():
        path = tf.compat.v1.placeholder(tf.string, [])
        count = tf.data.TFRecordDataset(path, info.compression_type).reduce(
            np.int64(0), lambda n, _: n + 1)
        with tf.compat.v1.Session() as sess:
            for shard, expected in zip(info.files, info.records_per_file):
                try:
                    found = sess.run(count, {path: shard})
                except tf.errors.DataLossError as e:
                    damaged.append((shard, _last_line(e.message)))
                    continue
                if found != expected:
                    damaged.append((shard, f'{found} records but {expected} listed'))
    return damaged


def _raised_data_error(error):
    """Returns the message of a DataError raised inside the pipeline (by a py_function), or None."""
    prefix = f'{onu_dataset.DataError.__name__}: '
    for line in str(error.message).splitlines():
        if line.startswith(prefix):
            return line[len(prefix):]
    return None


def _label_out_of_range(error):
    """Returns the stored label of a LABEL_OUT_OF_RANGE error's message, or None if it is another error."""
    match = re.search(re.escape(LABEL_OUT_OF_RANGE) + r'\]\s*\[(-?\d+)\]', str(error.message))
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def damaged_records_as_data_error(info):
    """Re-raises data errors of the input pipeline of info as one-line DataErrors.

    A DataLossError (damaged record) becomes a message naming the shard; a label outside the classes
    one naming --labels_offset; a DataError raised in the pipeline (every image of a split undecodable)
    loses TensorFlow's traceback. Wrap the loop that runs the graph built from distorted_inputs/inputs of info.
    """
    try:
        yield
    except tf.errors.DataLossError as e:
        if info.data_format == 'images':
            raise
        damaged = find_damaged_shards(info)
        where, problem = damaged[0] if damaged else (os.path.dirname(info.files[0]), _last_line(e.message))
        fix = (f're-create the records with {_convert_command(info.data_dir, info.data_format)} --overwrite'
               if info.layout == 'records' else 're-create it with the tool that wrote it, or move it away')
        raise onu_dataset.DataError(
            f'{where}: damaged {info.data_format} record file ({problem}); {fix}') from None
    except tf.errors.InvalidArgumentError as e:
        label = _label_out_of_range(e)
        if label is not None:
            raise onu_dataset.DataError(
                f'{info.data_dir}: a record of {info.split} has label {label}, not one of the {info.num_classes} '
                f'classes {info.labels_offset}..{info.labels_offset + info.num_classes - 1} (labels offset '
                f'{info.labels_offset}); pass the --labels_offset the records use') from None
        if info.data_format == 'images' or not any(sign in e.message for sign in UNREADABLE_RECORD_SIGNS):
            raise
        raise onu_dataset.DataError(
            f'{os.path.dirname(info.files[0])}: a {info.split} record lacks what the first one holds '
            f'({_last_line(e.message)}); every record needs {info.image_key} and {info.label_key}: re-create the '
            f'records, or move the odd file away') from None
    except tf.errors.UnknownError as e:
        message = _raised_data_error(e)
        if message is None:
            raise
        raise onu_dataset.DataError(message) from None
