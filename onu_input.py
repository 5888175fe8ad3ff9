"""Bytes -> tensors for the ONU classifier (the CIFAR-10 tutorial's cifar10_input.py role).

It turns the bytes of a DatasetInfo (one split, found by onu_dataset) into tensors with tf.data inside the caller's
tf.compat.v1 graph: decode, resize, augment, batch. It opens no folder and knows no layout. Three ways to feed the
same photos, all giving the same pixels (upright, RGB, same resize):
  images   the photo files, decoded at training time;
  raw      TFRecords of decoded pixels, read back with tf.io.decode_raw;
  encoded  TFRecords of the file bytes, decoded like the files.

    info = onu_dataset.describe(data_dir).split('train', 'encoded')
    cache = onu_decoded_cache.MemoryCache(info.num_examples)            # where the decoded epoch is kept
    images, labels = distorted_inputs(training_batches(info, 32, 299, cache, augment=AugmentOptions.default()))
    images, labels = next_batch(eval_batches(onu_dataset.describe(data_dir).split('val', 'encoded'), 32, 299))

Images are float32 [batch, size, size, 3] in [-1, 1] (what Inception checkpoints expect), labels int32 [batch].
preprocess_for_eval is the one eval/serving preprocessing. Training batches uint8 images and augments whole batches
with augment_batch (the entries of AUGMENTATIONS), in the pipeline or, with augment=None and --augment_on=model, in
distorted_inputs on the model's device. service_batches makes the same batches on a tf.data service's workers.
"""
import dataclasses
import functools
import math
import typing
import warnings
import zlib

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import model_pb2

from onu_lib import onu_dataset  # the one constant of the label check, shared with its error's translation
from onu_lib import onu_errors

# Corners uncovered by a rotation: mid grey, which is 0 in the model's [-1, 1] range.
ROTATION_FILL_VALUE = 0.5
# Where an augmentation's op runs (augment_batch runs them in this order) and what it takes; parameters are
# [batch], one per image, and weight is [batch, h, w, 1]: the share of each pixel the photo covers.
#   geometry  op(x, y, parameters, height, width) -> (x, y): maps the [batch, h, w] column and row coordinates of
#             the pixels it makes to those it reads; the maps are composed and the photo sampled once (bilinear).
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
AUGMENT_PLACEMENTS = ('input', 'model')  # where training augmentation runs: the tf.data pipeline, or the model's device
# JPEG DCT scale divisors libjpeg decodes at (1 = full size).
DCT_RATIOS = (1, 2, 4, 8)
# Training keeps the decoded epoch in memory up to this many bytes: later epochs skip reading and decoding.
DECODED_CACHE_BYTES = 2 * 2**30


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """One training augmentation: its --augmentations name, the uniform range of its per-image parameter, the
    AUGMENTATION_SPACES entry its op runs in, the op, and whether it is on when --augmentations is not given."""
    name: str
    low: float
    high: float
    space: str
    apply: typing.Callable
    on_by_default: bool = True

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


# ----------------------------------------------------------------------------------------------
# Decoding and preprocessing: one image at a time, usable in tf.data maps and tf.map_fn.

def decode_image_bytes(encoded, at_least=None):
    """Returns the uint8 [height, width, 3] RGB image of JPEG/PNG/GIF/BMP bytes; at_least (a side length, training
    only): decode a JPEG at the smallest DCT scale keeping that many pixels on its shorter side."""
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
    # resize returns float32 in [0, 255] whatever it is given: convert_image_dtype after it would scale nothing.
    resized = tf.image.resize(image, [image_size, image_size], method='bilinear')
    return resized * (1.0 / 255.0)


def to_model_range(image):
    """Returns an image in [0, 1] mapped to the model's input range [-1, 1]."""
    return image * 2.0 - 1.0


def pixels_to_model_range(pixels):
    """Returns uint8 pixels already at the model's size as float32 in the model's range [-1, 1]."""
    return to_model_range(tf.cast(pixels, tf.float32) * (1.0 / 255.0))


def to_pixels(image):
    """Returns an image in the model's range [-1, 1] as the uint8 pixels it stands for (rounded)."""
    return tf.cast(tf.round(tf.clip_by_value((image + 1.0) * 127.5, 0.0, 255.0)), tf.uint8)


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


def random_draws(seed, batch_size):
    """Returns [batch_size, NUM_DRAWS] uniform draws in [0, 1) for a [2] int seed: one row per image, one column
    per augmentation of AUGMENTATIONS, each from its own stream, so adding one leaves the others' draws as they are."""
    streams = [tf.random.experimental.stateless_fold_in(seed, tf.constant(augmentation.stream, tf.int64))
               for augmentation in AUGMENTATIONS]
    return tf.stack([tf.random.stateless_uniform([batch_size], seed=stream) for stream in streams], axis=1)


def distortion_params(draws):
    """Returns the augmentation parameters of [batch, NUM_DRAWS] draws: {name: [batch] in its [low, high]}."""
    return {augmentation.name: augmentation.low + (augmentation.high - augmentation.low) * draws[:, column]
            for column, augmentation in enumerate(AUGMENTATIONS)}


def rotation_transforms(angles, height, width):
    """Returns [batch, 8] ImageProjectiveTransform rows: input = centre + R(angle) (output - centre), per image."""
    cos, sin = tf.cos(angles), tf.sin(angles)
    centre_x, centre_y = (width - 1.0) / 2.0, (height - 1.0) / 2.0
    zeros = tf.zeros_like(angles)
    return tf.stack([cos, -sin, centre_x - cos * centre_x + sin * centre_y,
                     sin, cos, centre_y - sin * centre_x - cos * centre_y, zeros, zeros], axis=1)


def _sample_bilinear(images, x, y):
    """Returns uint8 [b, h, w, 3] images sampled bilinearly at [b, h, w] input coordinates (column x, row y): the
    colours as float RGB in [0, 1] (neighbours outside count nothing), and the share of each output pixel inside
    the photo ([b, h, w, 1]), so the caller blends in the fill after the colour ops."""
    shape = tf.shape(images)
    batch, height, width = shape[0], shape[1], shape[2]
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


def _rotate(x, y, angles, height, width):
    """The rotation's op (geometry): each image turned about its centre by its angle (radians)."""
    transforms = rotation_transforms(angles, height, width)

    def coefficient(index):
        return transforms[:, index][:, tf.newaxis, tf.newaxis]
    return (coefficient(0) * x + coefficient(1) * y + coefficient(2),
            coefficient(3) * x + coefficient(4) * y + coefficient(5))


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


# The training augmentations, in --augmentations' order. A new one is an entry here: the flag, AugmentOptions, the
# draws and the tests follow from it (benchmark_baselines says if it needs its own version there).
AUGMENTATIONS = (
    Augmentation('saturation', 0.8, 1.2, 'hsv', _scale_saturation),  # factor
    Augmentation('brightness', -32.0 / 255.0, 32.0 / 255.0, 'rgb', _shift_brightness),  # delta on [0, 1]
    Augmentation('contrast', 0.8, 1.2, 'rgb', _scale_contrast),  # factor
    Augmentation('hue', -0.2, 0.2, 'hsv', _shift_hue),  # share of the colour circle
    Augmentation('rotation', -math.radians(10.0), math.radians(10.0), 'geometry', _rotate),  # radians
)
NUM_DRAWS = len(AUGMENTATIONS)  # uniform draws per image: one per augmentation


def _moved(images, augmentations, params):
    """Returns the uint8 [b, h, w, 3] images moved by the geometry augmentations, as float RGB in [0, 1], and the
    share of each pixel the photo covers ([b, h, w, 1]; None when no augmentation moved anything)."""
    if not augmentations:
        return tf.cast(images, tf.float32) * (1.0 / 255.0), None
    shape = tf.shape(images)
    height, width = tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
    y, x = tf.meshgrid(tf.range(height), tf.range(width), indexing='ij')
    x, y = tf.broadcast_to(x, shape[:3]), tf.broadcast_to(y, shape[:3])
    # Each op maps the pixels of what it makes to those it reads: the last op's map comes first.
    for augmentation in reversed(augmentations):
        x, y = augmentation.apply(x, y, params[augmentation.name], height, width)
    return _sample_bilinear(images, x, y)  # once, however many ops: one interpolation, the coverage with it


def _augment_batch(images, draws, options):
    """augment_batch's computation, for one AugmentOptions."""
    params = distortion_params(draws)
    applied = {space: [augmentation for augmentation in AUGMENTATIONS
                       if augmentation.space == space and augmentation.name in options.names]
               for space in AUGMENTATION_SPACES}
    # Geometry first: the colour ops are per pixel, so they commute with the resampling, and they then
    # run on the pixels the model sees (the fill stays exactly grey).
    images, covered = _moved(images, applied['geometry'], params)
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
    # XLA fuses the dozen per-pixel steps into a few loops instead of one kernel pass over the batch each.
    return tf.function(lambda images, draws: _augment_batch(images, draws, options), jit_compile=True,
                       autograph=False)


def augment_batch(images, draws, augment=True):
    """Returns uint8 [batch, size, size, 3] images augmented by their [batch, NUM_DRAWS] draws, float32 in [-1, 1]."""
    images = tf.convert_to_tensor(images)
    if images.dtype != tf.uint8:
        raise ValueError(f'expected uint8 images, got {images.dtype.name}')
    return _compiled_augmentation(AugmentOptions.of(augment))(images, tf.cast(draws, tf.float32))


def add_input_summary(images):
    """Adds an image summary of the first few [-1, 1] training images."""
    shown = tf.image.convert_image_dtype((images[:NUM_SUMMARY_IMAGES] + 1.0) / 2.0, tf.uint8, saturate=True)
    tf.compat.v1.summary.image('augmented_inputs', shown, max_outputs=NUM_SUMMARY_IMAGES)


# ----------------------------------------------------------------------------------------------
# Images mode. A photo that fails to decode (damaged inside, or changed since the listing) stops the pipeline with
# an error naming it, never a silent gap in an epoch. Position p of epoch e is photo order(e, p) (_photo_order).

def _photo_order(num_files, training, seed):
    """Returns (epoch, positions) -> file indices: the listing's order, or a permutation per epoch."""
    if not training:
        return lambda epoch, positions: positions
    order_seed = seed if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])

    def file_index(epoch, positions):
        epoch_seed = tf.stack([tf.constant(order_seed, tf.int64), tf.cast(epoch, tf.int64)])
        return tf.random.experimental.index_shuffle(positions, epoch_seed, num_files - 1)
    return file_index


def _read_photo(info, at_least):
    """Returns read(index) -> photo `index`'s (upright uint8 image, int32 label, file name)."""
    paths = tf.constant(info.files)
    labels = tf.constant(info.labels, tf.int32)
    orientations = tf.constant(info.orientations, tf.int32)
    names = tf.constant(info.names)

    def read(index):
        # A photo that fails to decode stops the pipeline with TensorFlow's error, which
        # onu_dataset.read_errors_as_data_error turns into one line naming the photo.
        image = decode_image_bytes(tf.io.read_file(paths[index]), at_least)
        return apply_exif_orientation(image, orientations[index]), labels[index], names[index]
    return read


def _photo_unit(info, order, epoch, first, end, at_least=None):
    """Returns (upright uint8 image, label, file name, position) of positions [first, end) of epoch's order."""
    read = _read_photo(info, at_least)
    epoch = tf.cast(epoch, tf.int64)

    def read_at(position):
        return read(order(epoch, position)) + (position,)
    return tf.data.Dataset.range(first, end).map(read_at, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _decoded_files(info, training, seed, at_least=None, repeat=True):
    """Returns a dataset of (uint8 image, int32 label, file name relative to the data dir) from the image files of
    info: repeat, a new permutation per epoch forever (training), else one epoch."""
    num_files = len(info.files)
    order = _photo_order(num_files, training, seed)
    epochs = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    examples = epochs.flat_map(lambda epoch: _photo_unit(info, order, epoch, 0, num_files, at_least))
    return examples.map(lambda image, label, name, position: (image, label, name))


# ----------------------------------------------------------------------------------------------
# Record modes.

def _raw_pixels(features, info):
    """Returns the uint8 [h, w, 3] image of a raw record (channels from the byte count): grey replicated, no alpha."""
    height, width = features[info.height_key], features[info.width_key]
    pixels = tf.io.decode_raw(features[info.image_key], tf.uint8)
    channels = tf.size(pixels, out_type=tf.int64) // tf.maximum(height * width, 1)
    image = tf.reshape(pixels, tf.stack([height, width, channels]))
    image = tf.switch_case(tf.cast(tf.minimum(channels // 2, 2), tf.int32), [
        lambda: tf.tile(image, [1, 1, 3]), lambda: image, lambda: image[:, :, :3]])
    return tf.ensure_shape(image, [None, None, 3])


def _parse_record(serialized, info, at_least=None, record_name=''):
    """Returns (uint8 image, int32 class, file name or record_name) of one record of info; class = stored label -
    info.labels_offset, a LABEL_OUT_OF_RANGE error when it is not one of the classes."""
    spec = {info.image_key: tf.io.FixedLenFeature([], tf.string),
            info.label_key: tf.io.FixedLenFeature([], tf.int64)}
    if info.filename_key:
        spec[info.filename_key] = tf.io.FixedLenFeature([], tf.string, default_value='')
    if info.data_format == 'raw':
        spec.update({key: tf.io.FixedLenFeature([], tf.int64) for key in (info.height_key, info.width_key)})
    features = tf.io.parse_single_example(serialized, spec)
    if info.data_format == 'raw':
        image = _raw_pixels(features, info)
    else:
        image = decode_image_bytes(features[info.image_key], at_least)
    stored = features[info.label_key]
    in_range = tf.debugging.Assert(
        (stored >= info.labels_offset) & (stored < info.labels_offset + info.num_classes),
        [onu_dataset.LABEL_OUT_OF_RANGE, stored])
    with tf.control_dependencies([in_range]):
        label = tf.cast(stored - info.labels_offset, tf.int32)
    name = features[info.filename_key] if info.filename_key else tf.constant('')
    return image, label, tf.where(tf.equal(name, ''), record_name, name)


def _shuffle_buffer_size(info):
    """Returns how many records to shuffle in memory: SHUFFLE_BUFFER_BYTES worth, at most all."""
    by_memory = SHUFFLE_BUFFER_BYTES // max(info.bytes_per_example, 1)
    return max(1, min(info.num_examples, MAX_SHUFFLE_BUFFER, by_memory))


def _decoded_records(info, training, seed, at_least=None, repeat=True):
    """Returns a dataset of (uint8 image, int32 label, file name) from the record shards of info: training
    interleaves shuffled shards (forever when repeat) and shuffles records; eval reads them in info's order."""
    if training:
        deterministic = seed is not None
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

    def named_records(path, prefix):  # each record with <prefix><index>, its name if it names no file
        return tf.data.TFRecordDataset(path, compression_type=info.compression_type).enumerate().map(
            lambda index, record: (record, prefix + tf.strings.as_string(index)))
    records = tf.data.Dataset.from_tensor_slices((list(info.files), list(info.record_name_prefixes)))
    records = records.flat_map(named_records)
    return records.map(lambda record, name: _parse_record(record, info, at_least, name),
                       num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------------------------
# Pipelines: training examples and batches, eval batches. A dataset is built on PIPELINE_DEVICE and not converted by
# AutoGraph: its functions are plain TensorFlow ops (tf.cond, not Python if), and converting them slows start-up.

def _pipeline(build):
    """Returns build (a function that builds a dataset) building on PIPELINE_DEVICE, without AutoGraph."""
    @functools.wraps(build)
    def on_pipeline_device(*args, **kwargs):
        with tf.device(PIPELINE_DEVICE):
            return build(*args, **kwargs)
    return tf.autograph.experimental.do_not_convert(on_pipeline_device)


def decoded_epoch_bytes(num_examples, image_size):
    """Returns the bytes one epoch of num_examples resized uint8 training images takes in memory."""
    return num_examples * image_size * image_size * 3


def _decoded_examples(info, image_size, reduced_decode, seed, repeat):
    """Returns shuffled (uint8 [size, size, 3] image, label) training examples of info: one epoch, or endless."""
    decoded = _decoded_files if info.data_format == 'images' else _decoded_records
    examples = decoded(info, True, seed, at_least=image_size if reduced_decode else None, repeat=repeat)
    return examples.map(lambda image, label, name: (resize_for_training(image, image_size), label),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None)


def training_examples(info, image_size, cache, seed=None, reduced_decode=False):
    """Returns endless shuffled (uint8 [size, size, 3] image, int32 label) training examples of info, through cache
    (onu_decoded_cache's memory, disk or none). reduced_decode: decode at a reduced DCT scale (see README)."""
    return cache.training_examples(functools.partial(_decoded_examples, info, image_size, reduced_decode), seed)


@_pipeline
def training_batches(info, batch_size, image_size, cache, seed=None, reduced_decode=False, augment=None):
    """Returns endless shuffled training batches of info: (images in [-1, 1], labels) augmented by augment, or with
    augment None, (uint8 images, labels, draws) for augment_batch on the model's device (--augment_on=model)."""
    batches = training_examples(info, image_size, cache, seed, reduced_decode).batch(batch_size, drop_remainder=True)

    def with_draws(batch, batch_seed):
        images, labels = batch
        draws = random_draws(batch_seed, batch_size)
        if augment is None:
            return images, labels, draws
        return augment_batch(images, draws, augment), labels
    seeds = tf.data.Dataset.random(seed=seed).batch(2)
    batches = tf.data.Dataset.zip((batches, seeds)).map(
        with_draws, num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None)
    return batches.prefetch(tf.data.AUTOTUNE)


@_pipeline
def eval_batches(info, batch_size, image_size, with_filenames=False):
    """Returns the eval batches of (images, labels[, file names]) of info: each example once, in order, then the end
    (the final batch may be smaller: the batch dimension is None)."""
    decoded = _decoded_files if info.data_format == 'images' else _decoded_records
    examples = decoded(info, False, None, repeat=False)

    def preprocessed(image, label, name):
        example = (preprocess_for_eval(image, image_size), label)
        return example + (name,) if with_filenames else example
    return examples.map(preprocessed, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).prefetch(tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------------------------
# The tf.data service: the same batches, made by the service's workers.

SERVICE_CYCLE_LENGTH = 8       # units a service worker reads at once
SERVICE_PHOTOS_PER_UNIT = 8    # images mode: photos of an epoch's order handed to a worker at a time
MAX_RECORDS_PER_SHARD = 2**24  # an example's key is shard draw * this + its index in the shard


def eval_pixels(info, image_size, num_examples):
    """Returns (uint8 pixels [n, size, size, 3], labels [n]): up to num_examples examples spread evenly over a split, as
    eval preprocesses them, rounded to pixels (what the model's input takes); DataError when the split has none."""
    if not info.num_examples:
        raise onu_errors.DataError(f'{info.data_dir}: no {info.split} examples')
    every = max(1, info.num_examples // num_examples)  # across the split, so every class is among them
    with tf.Graph().as_default():
        examples = eval_batches(info, 32, image_size).unbatch()
        examples = examples.shard(every, 0).take(num_examples).map(
            lambda image, label: (to_pixels(image), label)).batch(32)
        batch = tf.compat.v1.data.make_one_shot_iterator(examples).get_next()
        batches = []
        with tf.compat.v1.Session() as session:
            try:
                while True:
                    batches.append(session.run(batch))
            except tf.errors.OutOfRangeError:
                pass
    return np.concatenate([pixels for pixels, _ in batches]), np.concatenate([labels for _, labels in batches])


def _service_examples(info, image_size, seed, reduced_decode, num_epochs=None):
    """Returns the (resized uint8 image, label, example key) the service's workers make: endless, or num_epochs epochs.
    The dispatcher hands each draw of a unit (photos, or a shard) to one worker; the key seeds the batch's draws."""
    at_least = image_size if reduced_decode else None
    if info.data_format == 'images':
        num_files = len(info.files)
        num_units = -(-num_files // SERVICE_PHOTOS_PER_UNIT)
        order = _photo_order(num_files, True, seed)

        def photos(draw):
            epoch, first = draw // num_units, (draw % num_units) * SERVICE_PHOTOS_PER_UNIT
            unit = _photo_unit(info, order, epoch, first, tf.minimum(first + SERVICE_PHOTOS_PER_UNIT, num_files),
                               at_least)
            return unit.map(lambda image, label, name, position: (image, label, epoch * num_files + position))
        examples = _unit_draws(num_units, num_epochs).interleave(
            photos, cycle_length=SERVICE_CYCLE_LENGTH, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        return examples.map(lambda image, label, key: (resize_for_training(image, image_size), label, key),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)

    num_units = len(info.files)
    shard_index = _photo_order(num_units, True, seed)

    def shard(draw):
        index = shard_index(draw // num_units, draw % num_units)
        records = tf.data.TFRecordDataset(tf.gather(info.files, index), compression_type=info.compression_type)
        return records.enumerate().map(lambda position, record: (record, draw * MAX_RECORDS_PER_SHARD + position))
    records = _unit_draws(num_units, num_epochs).interleave(
        shard, cycle_length=min(num_units, SERVICE_CYCLE_LENGTH), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False)
    records = records.shuffle(_shuffle_buffer_size(info), seed=seed)

    def example(record, key):
        image, label, _ = _parse_record(record, info, at_least)
        return resize_for_training(image, image_size), label, key
    return records.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def _unit_draws(num_units, num_epochs):
    """Returns the draws of units the dispatcher hands out: 0, 1, 2, ... forever, or num_epochs epochs of them."""
    return tf.data.Dataset.counter() if num_epochs is None else tf.data.Dataset.range(num_epochs * num_units)


def _quantized(images):
    """Returns augmented [-1, 1] images as uint8 (within half a grey level): a quarter of float32's bytes to send."""
    return tf.cast(tf.round((tf.clip_by_value(images, -1.0, 1.0) + 1.0) * 127.5), tf.uint8)


def _dequantized(images):
    """Returns _quantized images in the model's range [-1, 1] again."""
    return tf.cast(images, tf.float32) * (1.0 / 127.5) - 1.0


@dataclasses.dataclass(frozen=True)
class ServiceJob:
    """Where a tf.data service makes training batches: its dispatcher's grpc://HOST:PORT; the job name trainers share
    (None: this trainer's own); the job's epochs (None: endless)."""
    address: str
    name: str = None
    num_epochs: int = None


@_pipeline
def service_batches(info, batch_size, image_size, job, seed=None, reduced_decode=False, augment=None):
    """Returns training_batches' batches of info, made by the workers of a ServiceJob: they arrive as uint8 (augmented
    and _quantized, or with their draws); no decoded-epoch cache (a worker sees only its share of an epoch)."""
    seed = 0 if seed is None else seed
    examples = _service_examples(info, image_size, seed, reduced_decode, job.num_epochs)

    def with_draws(images, labels, keys):
        draws = random_draws(tf.stack([tf.constant(seed, tf.int64), keys[0]]), batch_size)
        if augment is None:
            return images, labels, draws
        return _quantized(augment_batch(images, draws, augment)), labels
    batches = examples.batch(batch_size, drop_remainder=True).map(with_draws, num_parallel_calls=tf.data.AUTOTUNE,
                                                                  deterministic=False)
    with warnings.catch_warnings():  # distribute() reads the dataset's options, which graph mode warns about
        warnings.filterwarnings('ignore', 'To make it possible to preserve tf.data options', UserWarning)
        batches = batches.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=job.address,
            job_name=job.name))
    if augment is not None:
        batches = batches.map(lambda images, labels: (_dequantized(images), labels))
    return batches.prefetch(tf.data.AUTOTUNE)


# Graph collection of the ops that serialize each input iterator's tf.data model (next_batch, for pipeline_work).
PIPELINE_MODEL_OPS = 'onu_input_pipeline_models'


def next_batch(dataset):
    """Returns dataset's next tensors from a one-shot iterator on PIPELINE_DEVICE (its model op: PIPELINE_MODEL_OPS)."""
    with tf.device(PIPELINE_DEVICE):
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
        # pylint: disable=protected-access  (the v1 iterator's resource: the one handle to its tf.data model)
        tf.compat.v1.add_to_collection(PIPELINE_MODEL_OPS,
                                       tf.raw_ops.IteratorGetModelProto(iterator=iterator._iterator_resource))
        return iterator.get_next()


@dataclasses.dataclass(frozen=True)
class PipelineWork:
    """What the input pipelines have done so far, by tf.data's own account: each node's seconds of work (summed over
    its threads), by (pipeline, node id), and the batches produced."""
    node_seconds: dict
    batches: int


def pipeline_work(serialized_models):
    """Returns the PipelineWork of the input pipelines from the values of PIPELINE_MODEL_OPS."""
    node_seconds, batches = {}, 0
    for pipeline, serialized in enumerate(serialized_models):
        model = model_pb2.ModelProto.FromString(serialized)
        node_seconds.update({(pipeline, node_id): node.processing_time / 1e9 for node_id, node in model.nodes.items()})
        if model.output in model.nodes:
            batches = max(batches, model.nodes[model.output].num_elements)
    return PipelineWork(node_seconds, batches)


def work_between(before, after):
    """Returns (seconds of pipeline work, batches made) between two PipelineWorks: what each node grew by (a node
    made in between counts all it did, one gone in between nothing), so never negative."""
    grown = sum(max(0.0, seconds - before.node_seconds.get(node, 0.0)) for node, seconds in after.node_seconds.items())
    return grown, after.batches - before.batches


def distorted_inputs(batches, augment=True):
    """Returns training (images in [-1, 1], labels) of batches, with an image summary of the first few; batches
    holding their draws (--augment_on=model) are augmented by augment here, in the caller's device scope."""
    images, labels, *draws = next_batch(batches)
    if draws:
        images = augment_batch(images, draws[0], augment)
    add_input_summary(images)
    return images, labels
