"""The loaders onu_input is measured against: the study's serial loops, plain tf.image and Keras.

Each builds the same training input (photos -> augmented batches in [-1, 1]) the way someone else would write it,
so that onu_benchmark.py can time it next to onu_input's pipelines. None of this is used for training.
"""
import math
import os

import numpy as np
import tensorflow as tf

from onu_lib import onu_dataset
from onu_lib import onu_errors
import onu_input


class SerialCv2Loader:
    """The study's loader: cv2 decodes one file at a time in Python, feed_dict ships each batch. Unlike the study
    it converts BGR to RGB, resizes first and runs the pipeline's augment_batch over each fed batch."""

    def __init__(self, data_dir, split, batch_size, image_size, augment=False):
        self.info = onu_dataset.describe(data_dir).split(split, 'images')
        self.batch_size = batch_size
        self.image_size = image_size
        self.skipped = set()
        self._rng = np.random.default_rng()
        options = onu_input.AugmentOptions.of(augment)
        with tf.device(onu_input.PIPELINE_DEVICE):
            self.image_batch = tf.compat.v1.placeholder(
                tf.uint8, [None, image_size, image_size, 3], name='serial_cv2_images')
            self.label_batch = tf.compat.v1.placeholder(tf.int32, [None], name='serial_cv2_labels')
            if options == onu_input.AugmentOptions.none():
                self.images = onu_input.to_model_range(tf.cast(self.image_batch, tf.float32) * (1.0 / 255.0))
            else:
                draws = tf.random.uniform([tf.shape(self.image_batch)[0], onu_input.NUM_DRAWS])
                self.images = onu_input.augment_batch(self.image_batch, draws, options)
            self.labels = tf.identity(self.label_batch)

    def read_image(self, path):
        """Returns the file at path as an upright RGB uint8 array resized to image_size, or None."""
        import cv2  # pylint: disable=import-outside-toplevel  (only the serial baselines use OpenCV)
        image = cv2.imread(path, cv2.IMREAD_COLOR)  # applies the EXIF orientation
        if image is None:
            return None
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        return cv2.resize(image, (self.image_size, self.image_size), interpolation=cv2.INTER_LINEAR)

    def feed_dicts(self, epochs=None):
        """Yields feed dicts of one batch each: shuffled and endless, or in order for `epochs`."""
        order = np.arange(self.info.num_examples)
        epoch = 0
        while epochs is None or epoch < epochs:
            if epochs is None:
                self._rng.shuffle(order)
            images, labels = [], []
            for index in order:
                image = self.read_image(self.info.files[index])
                if image is None:
                    self.skipped.add(self.info.files[index])
                    continue
                images.append(image)
                labels.append(self.info.labels[index])
                if len(images) == self.batch_size:
                    yield {self.image_batch: np.stack(images), self.label_batch: np.array(labels)}
                    images, labels = [], []
            if len(self.skipped) == self.info.num_examples:
                raise onu_errors.DataError(f'{self.info.data_dir}: OpenCV reads none of the images')
            if images and epochs is not None:
                yield {self.image_batch: np.stack(images), self.label_batch: np.array(labels)}
            epoch += 1


class StudySerialLoop:
    """The study's loader as the study wrote it: one photo at a time in Python, feed_dict per batch; rotation and
    exposure on the full-size photo, then resize and /255."""

    def __init__(self, data_dir, batch_size, image_size):
        self.info = onu_dataset.describe(data_dir).split('train', 'images')
        self.batch_size = batch_size
        self.image_size = image_size
        self._rng = np.random.default_rng()
        rotation, contrast = onu_input.augmentation_named('rotation'), onu_input.augmentation_named('contrast')
        self._degrees = (math.degrees(rotation.low), math.degrees(rotation.high))
        self._contrast = (contrast.low, contrast.high)
        with tf.device(onu_input.PIPELINE_DEVICE):
            self.image_batch = tf.compat.v1.placeholder(tf.float32, [None, image_size, image_size, 3],
                                                        name='study_images')
            self.label_batch = tf.compat.v1.placeholder(tf.int32, [None], name='study_labels')
            self.images = onu_input.to_model_range(self.image_batch)
            self.labels = tf.identity(self.label_batch)

    def read_image(self, path):
        """Returns the photo at path augmented at full size, resized, float32 in [0, 1]."""
        import cv2  # pylint: disable=import-outside-toplevel
        image = cv2.imread(path, cv2.IMREAD_COLOR)
        height, width = image.shape[:2]
        angle = self._rng.uniform(*self._degrees)
        rotation = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
        image = cv2.warpAffine(image, rotation, (width, height), borderValue=(128, 128, 128))
        image = cv2.convertScaleAbs(image, alpha=self._rng.uniform(*self._contrast),
                                    beta=self._rng.uniform(-32, 32))
        image = cv2.resize(image, (self.image_size, self.image_size), interpolation=cv2.INTER_LINEAR)
        return image / np.float32(255.0)

    def feed_dicts(self):
        """Yields endless feed dicts of one shuffled batch each."""
        order = np.arange(self.info.num_examples)
        while True:
            self._rng.shuffle(order)
            for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
                indices = order[start:start + self.batch_size]
                yield {self.image_batch: np.stack([self.read_image(self.info.files[i]) for i in indices]),
                       self.label_batch: np.array([self.info.labels[i] for i in indices])}


def _plain_decoded_examples(info):
    """Returns endless shuffled (full-size uint8 image, label) examples of info, decoded per image."""
    if info.data_format == 'images':
        examples = tf.data.Dataset.from_tensor_slices((list(info.files), list(info.labels)))
        return examples.shuffle(len(info.files)).repeat().map(
            lambda path, label: (tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label),
            num_parallel_calls=tf.data.AUTOTUNE)
    key = onu_dataset.KEY_RAW if info.data_format == 'raw' else onu_dataset.KEY_ENCODED

    def parse(record):
        """Returns (full-size uint8 image, label) of one record."""
        features = tf.io.parse_single_example(record, {
            key: tf.io.FixedLenFeature([], tf.string),
            onu_dataset.KEY_LABEL: tf.io.FixedLenFeature([], tf.int64),
            onu_dataset.KEY_HEIGHT: tf.io.FixedLenFeature([], tf.int64),
            onu_dataset.KEY_WIDTH: tf.io.FixedLenFeature([], tf.int64)})
        if info.data_format == 'raw':
            image = tf.reshape(tf.io.decode_raw(features[key], tf.uint8),
                               [features[onu_dataset.KEY_HEIGHT], features[onu_dataset.KEY_WIDTH], 3])
        else:
            image = tf.io.decode_jpeg(features[key], channels=3)
        return image, tf.cast(features[onu_dataset.KEY_LABEL], tf.int32)
    records = tf.data.Dataset.from_tensor_slices(list(info.files)).repeat().interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(info.files), 8), num_parallel_calls=tf.data.AUTOTUNE)
    return records.shuffle(256).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def _in_registry_order(implementations, baseline):
    """Returns {name: implementation} for every augmentation on by default, in onu_input.AUGMENTATIONS' order;
    one the baseline lacks stops it with one line."""
    missing = [name for name in onu_input.default_augmentation_names() if name not in implementations]
    if missing:
        raise NotImplementedError(f'{baseline} has no implementation of the augmentation {", ".join(missing)}: '
                                  f'add one to benchmark/baselines.py')
    return {name: implementations[name] for name in onu_input.default_augmentation_names()}


def _drawn_between(name):
    """Returns (low, high) of the parameter onu_input's augmentation name draws."""
    augmentation = onu_input.augmentation_named(name)
    return augmentation.low, augmentation.high


def plain_tf_image_augmentations(image_size):
    """Returns {name: per-image op on a float [image_size, image_size, 3] image in [0, 1]}: tf.image's random ops
    (and one ImageProjectiveTransformV3 rotation) at onu_input's ranges, in onu_input.AUGMENTATIONS' order."""
    def rotate(image):
        """Returns the image rotated by a random angle, bilinear, grey corners."""
        angle = tf.random.uniform([1], *_drawn_between('rotation'))
        return tf.raw_ops.ImageProjectiveTransformV3(
            images=image[tf.newaxis], transforms=onu_input.rotation_transforms(angle, image_size, image_size),
            output_shape=[image_size, image_size], fill_value=onu_input.ROTATION_FILL_VALUE,
            interpolation='BILINEAR', fill_mode='CONSTANT')[0]
    return _in_registry_order({
        'saturation': lambda image: tf.image.random_saturation(image, *_drawn_between('saturation')),
        'brightness': lambda image: tf.image.random_brightness(image, _drawn_between('brightness')[1]),
        'contrast': lambda image: tf.image.random_contrast(image, *_drawn_between('contrast')),
        'hue': lambda image: tf.image.random_hue(image, _drawn_between('hue')[1]),
        'rotation': rotate,
    }, 'the plain tf.image pipeline')


def plain_tf_image_dataset(info, batch_size, image_size):
    """The obvious tf.data code for the same training input, the yardstick of onu_input's pipeline: per image a
    full-size decode (or the raw pixels), resize, plain_tf_image_augmentations, clip, [-1, 1]."""
    augmentations = plain_tf_image_augmentations(image_size)

    def augment(image, label):
        """Returns the image resized, augmented with per-image tf.image ops, in [-1, 1]."""
        image = tf.image.resize(image, [image_size, image_size]) / 255.0
        for op in augmentations.values():
            image = op(image)
        return onu_input.to_model_range(tf.clip_by_value(image, 0.0, 1.0)), label
    examples = _plain_decoded_examples(info).map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    return examples.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def keras_augmentation_layers():
    """Returns {name: Keras's own augmentation layer} set to onu_input's ranges, for images in [0, 1], in
    onu_input.AUGMENTATIONS' order."""
    import keras  # pylint: disable=import-outside-toplevel
    low, high = _drawn_between('saturation')
    contrast_low, contrast_high = _drawn_between('contrast')
    return _in_registry_order({
        # RandomSaturation scales saturation by f / (1 - f): these bounds give low..high.
        'saturation': keras.layers.RandomSaturation((low / (1 + low), high / (1 + high)), value_range=(0, 1)),
        'brightness': keras.layers.RandomBrightness(_drawn_between('brightness')[1], value_range=(0, 1)),
        # A single float f would draw contrast from [1, 1 + f] only: the pair gives [1 - f, 1 + f].
        'contrast': keras.layers.RandomContrast((1 - contrast_low, contrast_high - 1), value_range=(0, 1)),
        # RandomHue shifts the hue by up to factor / 2 of the hue circle, either way.
        'hue': keras.layers.RandomHue(2 * _drawn_between('hue')[1], value_range=(0, 1)),
        # RandomRotation's factor is a share of a full turn.
        'rotation': keras.layers.RandomRotation(_drawn_between('rotation')[1] / (2 * math.pi), fill_mode='constant',
                                                fill_value=onu_input.ROTATION_FILL_VALUE, interpolation='bilinear'),
    }, 'the Keras layers baseline')


def keras_dataset(data_dir, class_names, batch_size, image_size, augmentation):
    """Returns Keras's image_dataset_from_directory over data_dir/train, then the augmentation, in [-1, 1].

    augmentation: None (eval preprocessing), 'keras_layers' (Keras's augmentation layers, what a Keras user writes)
    or 'keras_reader' (onu_input.augment_batch: only the reader differs from the pipelines). class_names: so that
    the ids match (Keras numbers the classes by sorted folder name)."""
    dataset = tf.keras.utils.image_dataset_from_directory(
        os.path.join(data_dir, 'train'), labels='inferred', label_mode='int', class_names=list(class_names),
        color_mode='rgb', batch_size=batch_size, image_size=(image_size, image_size), shuffle=True,
        interpolation='bilinear', verbose=False)
    layers = list(keras_augmentation_layers().values()) if augmentation == 'keras_layers' else []

    def preprocess(images, labels):
        """Returns a Keras batch augmented as augmentation says, in [-1, 1], with int32 labels."""
        if augmentation == 'keras_reader':
            pixels = tf.cast(tf.round(tf.clip_by_value(images, 0.0, 255.0)), tf.uint8)
            draws = tf.random.uniform([tf.shape(images)[0], onu_input.NUM_DRAWS])
            return onu_input.augment_batch(pixels, draws), tf.cast(labels, tf.int32)
        unit = images * (1.0 / 255.0)
        for layer in layers:
            unit = layer(unit, training=True)
        return onu_input.to_model_range(tf.clip_by_value(unit, 0.0, 1.0)), tf.cast(labels, tf.int32)
    return dataset.repeat().map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
