"""Measures the three ways to feed photos (images, raw, encoded) next to the study's baselines.

The study fed 3,562 ONU photos to Inception-ResNet-v2 three ways and found the original images 10x
slower (the GPU idle ~90% of the time). This script repeats that comparison on any photo folder, in
one run, and shows where the time goes:
  storage      bytes on disk and the ratio to the photos; seconds to convert, next to the seconds
               to read the photos once (both from a cold page cache);
  pipelines    images/sec of the tf.data pipelines (onu_input.make_dataset) with eval preprocessing
               and with every training augmentation, next to the study's serial cv2 loop, Keras's
               image_dataset_from_directory + the same augmentations (as Keras layers, and as
               onu_input's own function), and the decode limit (cores x the one-core decode+resize
               rate of the same files);
  training     sec/batch of each model fed by each way and by a synthetic in-memory batch;
               input-bound fraction = max(0, 1 - synthetic sec/batch / sec/batch): the share of a
               step lost to input (the study's "GPU idle", as a number).
Writes <output_dir>/<timestamp>.json, .md and .png, and prints the Markdown tables.

    python onu_benchmark.py                       # /tmp/onu_data (made if missing), both models
    python onu_benchmark.py --quick               # a short run on a subset, small model only
"""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # before TensorFlow loads: its C++ log buries the progress lines

import collections
import dataclasses
import datetime
import json
import math
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import convert_to_tfrecord
import make_sample_data
import onu_dataset
import onu_flags
import onu_input
import onu_model

FLAGS = flags.FLAGS

RESULT_MARKER = 'onu_benchmark result: '
PIPELINE_IMAGE_SIZE = 299  # the study's input size; pipelines use it unless --image_size is given
RECORD_WAYS = ('raw', 'encoded')
TF_DATA_WAYS = ('images',) + RECORD_WAYS
TRAINING_WAYS = TF_DATA_WAYS + ('serial_cv2', 'synthetic')
# Issue 13's: each model fed a synthetic batch (the model alone) and the encoded pipeline (end to end),
# in float32, mixed precision and with XLA, measured side by side.
PRECISION_WAYS = ('synthetic', 'encoded')
PRECISION_VARIANTS = ('mixed', 'xla')
# Issue 12's comparison, measured with the small model only (Inception-ResNet-v2 is not input-bound here).
SMALL_MODEL_TRAINING_WAYS = ('encoded_decoding', 'encoded_on_model', 'plain_tf_image', 'study_serial')
# variant -> what feeds: onu_input's default (decoded epoch cached), onu_input decoding every image
# exactly or at a reduced DCT scale, onu_input with augmentation placed on the model, and the plain
# tf.image pipeline.
AUGMENTATION_VARIANTS = ('cached', 'decoding', 'reduced_decode', 'on_model', 'plain_tf_image')
KERAS_WAYS = ('keras_layers', 'keras_reader')
KERAS_AUGMENTATION = {'keras_layers': ' by Keras layers', 'keras_reader': ' by onu_input'}
PIPELINE_WAYS = ('encoded', 'raw', 'images', 'serial_cv2') + KERAS_WAYS  # in table and plot order
ROW_ORDER = PIPELINE_WAYS + ('decode_limit', 'synthetic')
ROW_TITLES = {
    'encoded': 'encoded JPEG in TFRecords (gfile)',
    'raw': 'raw pixels in TFRecords (tobytes)',
    'images': 'original images, tf.data pipeline (the fix)',
    'serial_cv2': 'original images, serial cv2 loop + feed_dict (the study)',
    'keras_layers': 'original images, Keras image_dataset_from_directory + Keras augmentation layers',
    'keras_reader': 'original images, Keras image_dataset_from_directory + onu_input augmentation',
    'decode_limit': 'decode limit: cores x one-core decode+resize',
    'synthetic': 'synthetic in-memory batch (no input)',
    'encoded_decoding': 'encoded, onu_input without the decoded-epoch cache (decodes every image)',
    'encoded_on_model': 'encoded, augmentation placed on the model (--augment_on=model)',
    'plain_tf_image': 'original images, plain tf.image pipeline (full decode, per-image tf.image ops)',
    'study_serial': 'original images, the study\'s serial loop as written (augments the full photo)',
}
QUICK_SETTINGS = {'repeats': 1, 'batches': 3, 'warmup_batches': 1, 'max_images_per_class': 32,
                  'train_steps': ['small:3', 'inception_resnet_v2:1'],
                  'train_warmup_steps': ['small:1', 'inception_resnet_v2:1']}
FULL_RUN_MODELS = ('small', 'inception_resnet_v2')
QUICK_MODELS = ('small',)
# Rough costs for the progress estimate, replaced by measured durations as the run goes.
PRIOR_IMAGES_PER_SEC = {'pipeline': 150.0, 'serial_cv2': 60.0, 'convert_raw': 80.0, 'convert_encoded': 400.0}
PRIOR_SEC_PER_STEP_32 = {'small': 0.5, 'inception_resnet_v2': 16.0}  # batch 32, the model's image size
PRIOR_BUILD_SECONDS = {'small': 3.0, 'inception_resnet_v2': 40.0}
BUSY_MACHINE_CORES = 0.2  # other processes using more than this during a measurement disturb it
PRIOR_FRESH_PYTHON_SECONDS = 5.0  # starting a FreshPython (it imports TensorFlow) at its first call

flags.DEFINE_string('output_dir', 'benchmark_results',
                    'Where <timestamp>.json, .md and .png go (created if missing).')
flags.DEFINE_string('work_dir', None,
                    'Parent of the temporary folder for the converted records (about 12x the photos '
                    'while raw conversion is timed); default: the system temp folder. Removed at the end.')
flags.DEFINE_integer('repeats', 3, 'Repeats of every measurement; tables show medians.', lower_bound=1)
flags.DEFINE_integer('batches', 20, 'Timed batches per input-pipeline measurement.', lower_bound=1)
flags.DEFINE_integer('warmup_batches', 5, 'Untimed batches before each input-pipeline measurement.',
                     lower_bound=0)
flags.DEFINE_list('train_steps', ['small:20', 'inception_resnet_v2:1'],
                  'model:N timed training steps per repeat.')
flags.DEFINE_list('train_warmup_steps', ['small:5', 'inception_resnet_v2:2'],
                  'model:N untimed training steps first (the first steps set up the graph).')
flags.DEFINE_list('train_batch_size', [], 'model:N batch size for training; default --batch_size.')
flags.DEFINE_integer('max_images_per_class', 0,
                     'Use at most this many photos per class in each split (copied to the work folder); '
                     '0 = all.', lower_bound=0)
flags.DEFINE_boolean('quick', False,
                     'A short run: 1 repeat, 3 batches, at most 32 photos per class, small model only '
                     '(flags given explicitly still win).')


def _is_per_model_list(values, lowest):
    """True if every item is model:N with a known model name and an integer N >= lowest."""
    try:
        return all(name in onu_model.MODEL_NAMES and int(number) >= lowest
                   for name, number in (value.split(':') for value in values))
    except ValueError:
        return False


for _name, _lowest in (('train_steps', 1), ('train_warmup_steps', 0), ('train_batch_size', 1)):
    flags.register_validator(_name, lambda values, lowest=_lowest: _is_per_model_list(values, lowest),
                             message=f'--{_name} takes model:N items with N >= {_lowest}, '
                                     f'e.g. small:20,inception_resnet_v2:2')


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one benchmark run measures and how long it measures it."""
    data_dir: str
    image_size: int          # input pipelines
    batch_size: int          # input pipelines
    repeats: int
    batches: int
    warmup_batches: int
    models: tuple
    train_image_size: dict   # model -> side of its input
    train_batch_size: dict   # model -> batch size
    train_steps: dict        # model -> timed steps per repeat
    train_warmup_steps: dict  # model -> untimed steps first
    max_images_per_class: int


# ----------------------------------------------------------------------------------------------
# Measurements: each returns a dict of numbers.

def _cpu_seconds():
    """Returns the CPU seconds this process has used so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def evict_from_page_cache(paths):
    """Drops the files from the kernel's page cache, so that the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_read_files(paths):
    """Reads every file once from a cold page cache; returns seconds and bytes."""
    evict_from_page_cache(paths)
    started = time.perf_counter()
    num_bytes = 0
    for path in paths:
        with open(path, 'rb') as f:
            num_bytes += len(f.read())
    return {'seconds': time.perf_counter() - started, 'bytes': num_bytes}


def measure_conversion(data_dir, output_dir, record_format, processes):
    """Converts data_dir to record_format records in output_dir; returns seconds and bytes summed over splits.

    Run it in a FreshPython, whose worker processes start as convert_to_tfrecord.py's do.
    """
    started = time.perf_counter()
    manifest = convert_to_tfrecord.convert(data_dir, output_dir, formats=(record_format,), processes=processes)
    seconds = time.perf_counter() - started
    entries = [formats[record_format] for formats in manifest['splits'].values()]
    return {'seconds': seconds, 'processes': onu_dataset.worker_count(processes),
            'records': sum(entry['records'] for entry in entries),
            'record_bytes': sum(entry['record_bytes'] for entry in entries),
            'source_bytes': sum(entry['source_bytes'] for entry in entries),
            'pixel_bytes': sum(entry['pixel_bytes'] for entry in entries)}


_SERVER_CODE = f"""
import json, os, sys
cpu = json.loads(sys.argv[1])
if cpu is not None:
    os.sched_setaffinity(0, {{cpu}})  # before any thread starts, so that every thread inherits it
import onu_benchmark
for line in sys.stdin:
    name, kwargs = json.loads(line)
    print({RESULT_MARKER!r} + json.dumps(getattr(onu_benchmark, name)(**kwargs)), flush=True)
"""


class FreshPython:
    """A new Python process that imports this module once, then runs its functions on request.

    Measurements timed in there exclude its imports. Worker processes it starts (the converter's)
    import only what they need, as when a user runs convert_to_tfrecord.py; from this script they
    would import it, and TensorFlow with it. cpu: pin the whole process to that one CPU.
    """

    def __init__(self, log_path, cpu=None):
        self._log_path = log_path
        self._cpu = cpu
        self._log = None
        self._process = None

    def _start(self):
        """Starts the process (at the first call, so that its imports disturb no earlier measurement)."""
        self._log = open(self._log_path, 'w', encoding='utf-8')  # a file, not a pipe: a full pipe would block it
        self._process = subprocess.Popen(
            [sys.executable, '-c', _SERVER_CODE, json.dumps(self._cpu)],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)

    def call(self, function_name, **kwargs):
        """Returns onu_benchmark.<function_name>(**kwargs) computed in the process."""
        if self._process is None:
            self._start()
        try:
            self._process.stdin.write(json.dumps([function_name, kwargs]) + '\n')
            self._process.stdin.flush()
            for line in self._process.stdout:
                if line.startswith(RESULT_MARKER):
                    return json.loads(line[len(RESULT_MARKER):])
        except BrokenPipeError:
            pass
        self._log.flush()
        with open(self._log_path, encoding='utf-8') as f:
            last = [line.strip() for line in f if line.strip()][-1:] or ['no output']
        raise RuntimeError(f'{function_name} failed in a subprocess (log: {self._log_path}): {last[0]}')

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait()
            self._process.stdout.close()
            self._log.close()


def _consumed(images, labels):
    """Returns labels, computed only once images are: fetching it runs the whole input."""
    with tf.control_dependencies([images]):
        return tf.identity(labels)


def _time_runs(sess, fetch, warmup, runs, feeds=None):
    """Runs fetch warmup + runs times; returns images/sec and CPU cores busy over the timed runs."""
    for _ in range(warmup):
        sess.run(fetch, next(feeds) if feeds else None)
    cpu_started, started = _cpu_seconds(), time.perf_counter()
    num_images = sum(len(sess.run(fetch, next(feeds) if feeds else None)) for _ in range(runs))
    seconds = time.perf_counter() - started
    return {'images_per_sec': num_images / seconds, 'cores_busy': (_cpu_seconds() - cpu_started) / seconds,
            'images': num_images, 'seconds': seconds}


def _session(config=None):
    """Returns a session configured as training configures it (or with config)."""
    return tf.compat.v1.Session(config=config or onu_flags.session_config())


def measure_pipeline(info, batch_size, image_size, augment, warmup, batches, cache=None, augment_on='input',
                     reduced_decode=False):
    """Images/sec of onu_input's pipeline over info: training (augment) or eval preprocessing.

    augment=False measures the eval pipeline (exact decode, resize, scale), restarted at each epoch
    end. Training pipelines are shuffled and repeated; cache and reduced_decode: make_dataset's;
    augment_on='model' runs augment_batch in the graph after the pipeline, as --augment_on=model does.
    """
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            if augment:
                dataset = onu_input.make_dataset(info, batch_size, image_size, training=True, cache=cache,
                                                 augment_on=augment_on, reduced_decode=reduced_decode)
            else:
                dataset = onu_input.make_dataset(info, batch_size, image_size, training=False).repeat()
            batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        images, labels = batch[:2]
        fetch = _consumed(images, labels)
        if augment_on == 'model':
            # Grappler drops a control dependency on a stateless op: make the labels depend on its data.
            augmented = onu_input.augment_batch(images, batch[2])
            fetch = fetch + tf.cast(tf.reduce_max(augmented) > 1.0, tf.int32)  # never true: adds 0
        with _session() as sess:
            return _time_runs(sess, fetch, warmup, batches)


def plain_tf_image_dataset(info, batch_size, image_size):
    """The obvious tf.data code for the same training input: the yardstick of onu_input's pipeline.

    Per image: full-size decode (or the raw pixels), resize, tf.image.random_saturation,
    random_brightness, random_contrast and random_hue, one ImageProjectiveTransformV3 rotation,
    clip, [-1, 1]. This was onu_input's own algorithm before the batched augmentation.
    """
    if info.data_format == 'images':
        examples = tf.data.Dataset.from_tensor_slices((list(info.files), list(info.labels)))
        examples = examples.shuffle(len(info.files)).repeat().map(
            lambda path, label: (tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label),
            num_parallel_calls=tf.data.AUTOTUNE)
    else:
        key = onu_dataset.KEY_RAW if info.data_format == 'raw' else onu_dataset.KEY_ENCODED

        def parse(record):
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
        examples = records.shuffle(256).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    max_angle = math.radians(onu_input.MAX_ROTATION_DEGREES)

    def augment(image, label):
        image = tf.image.resize(image, [image_size, image_size]) / 255.0
        image = tf.image.random_saturation(image, *onu_input.SATURATION_RANGE)
        image = tf.image.random_brightness(image, onu_input.BRIGHTNESS_MAX_DELTA)
        image = tf.image.random_contrast(image, *onu_input.CONTRAST_RANGE)
        image = tf.image.random_hue(image, onu_input.HUE_MAX_DELTA)
        angle = tf.random.uniform([1], -max_angle, max_angle)
        image = tf.raw_ops.ImageProjectiveTransformV3(
            images=image[tf.newaxis], transforms=onu_input.rotation_transforms(angle, image_size, image_size),
            output_shape=[image_size, image_size], fill_value=onu_input.ROTATION_FILL_VALUE,
            interpolation='BILINEAR', fill_mode='CONSTANT')[0]
        return onu_input.to_model_range(tf.clip_by_value(image, 0.0, 1.0)), label
    examples = examples.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    return examples.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def measure_plain_tf_image(info, batch_size, image_size, warmup, batches):
    """Images/sec of plain_tf_image_dataset over info."""
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            dataset = plain_tf_image_dataset(info, batch_size, image_size)
            fetch = _consumed(*tf.compat.v1.data.make_one_shot_iterator(dataset).get_next())
        with _session() as sess:
            return _time_runs(sess, fetch, warmup, batches)


class StudySerialLoop:
    """The study's loader as the study wrote it: one photo at a time in Python, feed_dict per batch.

    Per photo: cv2.imread, a random rotation (+/-10 degrees, grey corners) and a random exposure
    (contrast x0.8-1.2, brightness +/-32) on the full-size photo, then resize and /255. Nothing runs
    in parallel but what OpenCV itself threads.
    """

    def __init__(self, data_dir, batch_size, image_size, seed=None):
        self.info = onu_input.dataset_info(data_dir, 'images', 'train')
        self.batch_size = batch_size
        self.image_size = image_size
        self._rng = np.random.default_rng(seed)
        with tf.device(onu_input.PIPELINE_DEVICE):
            self.image_batch = tf.compat.v1.placeholder(tf.float32, [None, image_size, image_size, 3],
                                                        name='study_images')
            self.label_batch = tf.compat.v1.placeholder(tf.int32, [None], name='study_labels')
            self.images = onu_input.to_model_range(self.image_batch)
            self.labels = tf.identity(self.label_batch)

    def read_image(self, path):
        """Returns the photo at path augmented at full size, resized, float32 in [0, 1]."""
        import cv2  # pylint: disable=import-outside-toplevel  (only the baselines use OpenCV)
        image = cv2.imread(path, cv2.IMREAD_COLOR)
        height, width = image.shape[:2]
        angle = self._rng.uniform(-onu_input.MAX_ROTATION_DEGREES, onu_input.MAX_ROTATION_DEGREES)
        rotation = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
        image = cv2.warpAffine(image, rotation, (width, height), borderValue=(128, 128, 128))
        image = cv2.convertScaleAbs(image, alpha=self._rng.uniform(*onu_input.CONTRAST_RANGE),
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


def measure_study_serial(data_dir, batch_size, image_size, warmup, batches):
    """Images/sec of StudySerialLoop."""
    with tf.Graph().as_default():
        loop = StudySerialLoop(data_dir, batch_size, image_size)
        fetch = _consumed(loop.images, loop.labels)
        with _session() as sess:
            return _time_runs(sess, fetch, warmup, batches, feeds=loop.feed_dicts())


def measure_serial_cv2(data_dir, batch_size, image_size, augment, warmup, batches):
    """Images/sec of the study's loader: cv2 reads one file at a time, feed_dict ships the batch."""
    with tf.Graph().as_default():
        loader = onu_input.SerialCv2Loader(data_dir, 'train', batch_size, image_size, augment=augment)
        fetch = _consumed(loader.images, loader.labels)
        with _session() as sess:
            return _time_runs(sess, fetch, warmup, batches, feeds=loader.feed_dicts())


def keras_augmentation_layers():
    """Returns Keras's own augmentation layers set to onu_input's ranges, for images in [0, 1]."""
    import keras  # pylint: disable=import-outside-toplevel
    low, high = onu_input.SATURATION_RANGE
    return [
        # RandomSaturation scales saturation by f / (1 - f): these bounds give low..high.
        keras.layers.RandomSaturation((low / (1 + low), high / (1 + high)), value_range=(0, 1)),
        keras.layers.RandomBrightness(onu_input.BRIGHTNESS_MAX_DELTA, value_range=(0, 1)),
        # A single float f would draw contrast from [1, 1 + f] only: the pair gives [1 - f, 1 + f].
        keras.layers.RandomContrast((1 - onu_input.CONTRAST_RANGE[0], onu_input.CONTRAST_RANGE[1] - 1),
                                    value_range=(0, 1)),
        # RandomHue shifts the hue by up to factor / 2 of the hue circle, either way.
        keras.layers.RandomHue(2 * onu_input.HUE_MAX_DELTA, value_range=(0, 1)),
        keras.layers.RandomRotation(onu_input.MAX_ROTATION_DEGREES / 360, fill_mode='constant',
                                    fill_value=onu_input.ROTATION_FILL_VALUE, interpolation='bilinear'),
    ]


def keras_dataset(data_dir, class_names, batch_size, image_size, augmentation):
    """Returns Keras's image_dataset_from_directory over data_dir/train, then the augmentation, in [-1, 1].

    augmentation: None (eval preprocessing), 'keras_layers' (Keras's augmentation layers on each
    batch, what a Keras user writes) or 'keras_reader' (onu_input.augment_batch on each batch, with
    per-image draws: the same code as the pipelines, so only the reader differs).
    Keras decodes and resizes each file to float32 [0, 255]. It numbers the classes by sorted
    folder name: class_names is passed so the ids match.
    """
    dataset = tf.keras.utils.image_dataset_from_directory(
        os.path.join(data_dir, 'train'), labels='inferred', label_mode='int', class_names=list(class_names),
        color_mode='rgb', batch_size=batch_size, image_size=(image_size, image_size), shuffle=True,
        interpolation='bilinear', verbose=False)
    layers = keras_augmentation_layers() if augmentation == 'keras_layers' else []

    def preprocess(images, labels):
        if augmentation == 'keras_reader':
            pixels = tf.cast(tf.round(tf.clip_by_value(images, 0.0, 255.0)), tf.uint8)
            draws = tf.random.uniform([tf.shape(images)[0], onu_input.NUM_DRAWS])
            return onu_input.augment_batch(pixels, draws), tf.cast(labels, tf.int32)
        unit = images * (1.0 / 255.0)
        for layer in layers:
            unit = layer(unit, training=True)
        return onu_input.to_model_range(tf.clip_by_value(unit, 0.0, 1.0)), tf.cast(labels, tf.int32)
    return dataset.repeat().map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def measure_keras_baseline(data_dir, class_names, batch_size, image_size, augmentation, warmup, batches):
    """Images/sec of keras_dataset (Keras's own folder reader + the augmentation)."""
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            dataset = keras_dataset(data_dir, class_names, batch_size, image_size, augmentation)
            # Keras's random layers keep their seed in a variable: a one-shot iterator cannot hold it.
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            fetch = _consumed(*iterator.get_next())
        with _session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
            return _time_runs(sess, fetch, warmup, batches)


def _single_core_dataset(paths, batch_size, image_size):
    """Returns batches of the files decoded (the pipelines' decoder) and resized on one thread."""
    dataset = tf.data.Dataset.from_tensor_slices(list(paths)).repeat().map(
        lambda path: onu_input.preprocess_for_eval(onu_input.decode_image_bytes(tf.io.read_file(path)),
                                                   image_size))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return dataset.batch(batch_size).with_options(options)


def measure_single_core_decode(data_dir, batch_size, image_size, warmup, batches):
    """Images/sec of decode+resize of data_dir's training photos on one thread: TensorFlow and cv2.

    TensorFlow is the pipelines' decoder (and so the decode limit); cv2 is the serial loop's.
    Run it in a FreshPython pinned to one CPU, so that no helper thread uses a second core.
    """
    info = onu_input.dataset_info(data_dir, 'images', 'train')
    single_threaded = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with tf.Graph().as_default():
        dataset = _single_core_dataset(info.files, batch_size, image_size)
        images = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        fetch = _consumed(images, tf.zeros(tf.shape(images)[:1]))
        with _session(single_threaded) as sess:
            tf_rate = _time_runs(sess, fetch, warmup, batches)
    return {'images_per_sec': tf_rate['images_per_sec'], 'cores_busy': tf_rate['cores_busy'],
            'cv2_images_per_sec': _cv2_single_core_rate(info, image_size, batches * batch_size)}


def measure_decode_limit(one_core, data_dir, batch_size, image_size, warmup, batches):
    """The decode limit: cores x the decode+resize rate of the same files in one_core, a FreshPython on one CPU."""
    cores = onu_dataset.worker_count()
    single = one_core.call('measure_single_core_decode', data_dir=data_dir, batch_size=batch_size,
                           image_size=image_size, warmup=warmup, batches=batches)
    return {'images_per_sec': cores * single['images_per_sec'], 'cores': cores,
            'single_core_images_per_sec': single['images_per_sec'], 'single_core_cores_busy': single['cores_busy'],
            'cv2_single_core_images_per_sec': single['cv2_images_per_sec']}


def _cv2_single_core_rate(info, image_size, num_images):
    """Images/sec of the serial loader's cv2 read+resize on one thread, over num_images of info's files."""
    import cv2  # pylint: disable=import-outside-toplevel  (only the baselines use OpenCV)
    with tf.Graph().as_default():
        read_image = onu_input.SerialCv2Loader(info.data_dir, 'train', 1, image_size).read_image
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        paths = [info.files[i % len(info.files)] for i in range(num_images)]
        started = time.perf_counter()
        for path in paths:
            read_image(path)
        return len(paths) / (time.perf_counter() - started)
    finally:
        cv2.setNumThreads(threads)


def _synthetic_inputs(batch_size, image_size, num_classes):
    """Returns an in-memory (images, labels) batch: a variable set once, so a step reads no input."""
    images = tf.compat.v1.Variable(
        tf.random.uniform([batch_size, image_size, image_size, 3], -1.0, 1.0), trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], name='synthetic_images')
    labels = tf.constant(np.arange(batch_size) % num_classes, tf.int32)
    return images.read_value(), labels


def training_inputs(way, info_of, batch_size, image_size):
    """Returns (images, labels, feeds) of one way, with every training augmentation; feeds None or an iterator.

    info_of(way) -> the DatasetInfo that way reads (the photos' for serial_cv2 and synthetic).
    """
    photos = info_of('images')
    if way == 'synthetic':
        return _synthetic_inputs(batch_size, image_size, photos.num_classes) + (None,)
    if way in ('serial_cv2', 'study_serial'):
        if way == 'serial_cv2':
            loader = onu_input.SerialCv2Loader(photos.data_dir, 'train', batch_size, image_size, augment=True)
        else:
            loader = StudySerialLoop(photos.data_dir, batch_size, image_size)
        return loader.images, loader.labels, loader.feed_dicts()
    with tf.device(onu_input.PIPELINE_DEVICE):
        if way == 'plain_tf_image':
            dataset = plain_tf_image_dataset(photos, batch_size, image_size)
        else:
            reads = way.split('_')[0]
            dataset = onu_input.make_dataset(
                info_of(reads), batch_size, image_size, training=True,
                cache=False if way == 'encoded_decoding' else None,
                augment_on='model' if way == 'encoded_on_model' else 'input')
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    if way == 'encoded_on_model':
        return onu_input.augment_batch(batch[0], batch[2]), batch[1], None
    return batch[0], batch[1], None


def _epoch_batches(info, batch_size):
    """Returns how many training batches make one epoch of info."""
    return math.ceil(info.num_examples / batch_size)


class TrainingRun:
    """A training graph of model_name fed by way, in its own session: run warmup, then time windows."""

    def __init__(self, model_name, way, info_of, batch_size, image_size, compute_dtype='float32', xla=False):
        info = info_of('images')
        self.graph = tf.Graph()
        with self.graph.as_default():
            images, labels, self._feeds = training_inputs(way, info_of, batch_size, image_size)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            logits, end_points = onu_model.inference(images, info.num_classes, model_name, is_training=True)
            total_loss = onu_model.loss(logits, labels, end_points)
            train_op = onu_model.train(total_loss, global_step, info.num_examples, batch_size,
                                       learning_rate=onu_model.DEFAULT_LEARNING_RATE[model_name],
                                       compute_dtype=compute_dtype)
            self._step = [train_op, total_loss]  # one fetch list throughout: a new one sets up a new executor
            self.session = _session(onu_model.set_precision_options(onu_flags.session_config(), compute_dtype, xla))
            self.session.run([tf.compat.v1.global_variables_initializer(),
                              tf.compat.v1.local_variables_initializer()])
        self.windows, self.final_loss = [], None

    def run(self, steps):
        """Runs steps training steps."""
        for _ in range(steps):
            _, self.final_loss = self.session.run(self._step, next(self._feeds) if self._feeds else None)

    def time_window(self, steps):
        """Times steps training steps; appends their sec/batch to windows."""
        started = time.perf_counter()
        self.run(steps)
        self.windows.append((time.perf_counter() - started) / steps)

    def result(self, batch_size, image_size):
        """Returns the median window and the details as a result dict; closes the session."""
        self.session.close()
        sec_per_batch = statistics.median(self.windows)
        return {'sec_per_batch': sec_per_batch, 'examples_per_sec': batch_size / sec_per_batch,
                'sec_per_batch_repeats': self.windows, 'batch_size': batch_size, 'image_size': image_size,
                'final_loss': float(self.final_loss)}


def measure_training(model_name, way, info_of, batch_size, image_size, warmup, steps, repeats, **options):
    """Sec/batch of training model_name fed by way: the median over repeats of steps steps each.

    The graph is onu_train's (inference, loss, train op with EMA) without its summaries;
    options: TrainingRun's compute_dtype and xla.
    """
    run = TrainingRun(model_name, way, info_of, batch_size, image_size, **options)
    run.run(warmup)
    for _ in range(repeats):
        run.time_window(steps)
    return run.result(batch_size, image_size)


def measure_training_variants(model_name, way, info_of, batch_size, image_size, warmup, steps, repeats,
                              interleave):
    """{variant: measure_training's result} for float32, mixed and XLA (PRECISION_VARIANTS) training.

    interleave: keep the three sessions open and alternate their timed windows, so that a slow
    spell of the machine slows all three alike (the ratios are what matters); otherwise measure one
    after the other (for a model too large to hold three times).
    """
    options = {'float32': {}, 'mixed': {'compute_dtype': mixed_compute_dtype()}, 'xla': {'xla': True}}
    names = ('float32',) + PRECISION_VARIANTS
    if not interleave:
        return {name: measure_training(model_name, way, info_of, batch_size, image_size, warmup, steps,
                                       repeats, **options[name]) for name in names}
    runs = {name: TrainingRun(model_name, way, info_of, batch_size, image_size, **options[name]) for name in names}
    for run in runs.values():
        run.run(warmup)
    for _ in range(repeats):
        for run in runs.values():
            run.time_window(steps)
    return {name: run.result(batch_size, image_size) for name, run in runs.items()}


# ----------------------------------------------------------------------------------------------
# Running the measurements with a progress display.

@dataclasses.dataclass
class Task:
    """One measurement: results of tasks with the same key are repeats of each other."""
    key: tuple
    label: str
    run: object       # () -> dict
    describe: object  # dict -> short text
    estimate: float   # seconds, used until a task with the same key has run


def _duration(seconds):
    """Returns seconds as '1h02m', '4m05s' or '12s'."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


def machine_busy_seconds():
    """Returns the CPU seconds every process on the machine has used since boot (Linux /proc/stat)."""
    with open('/proc/stat', encoding='ascii') as f:
        user, nice, system, _, _, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf('SC_CLK_TCK')


def own_cpu_seconds():
    """Returns the CPU seconds of this process and of all its descendants, finished ones included."""
    parents, ticks = {}, {}
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open(f'/proc/{name}/stat', encoding='ascii', errors='replace') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:  # the process has just ended
            continue
        parents[int(name)] = int(fields[1])
        ticks[int(name)] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    tree, grown = {os.getpid()}, True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= children
        grown = bool(children)
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf('SC_CLK_TCK')


def run_tasks(tasks):
    """Runs tasks in order, printing a line for each with its result, time so far and time left.

    Returns {key: [result of each repeat]}; each result also holds other_processes_cores, the
    cores that processes outside this benchmark kept busy meanwhile (0 on an idle machine).
    """
    results, durations = collections.defaultdict(list), collections.defaultdict(list)
    started = time.time()
    width = len(str(len(tasks)))
    for index, task in enumerate(tasks, start=1):
        prefix = f'[{index:{width}d}/{len(tasks)}] {task.label}'
        # On a terminal the result line overwrites this one; in a log both stay.
        print(f'{prefix} ...', end='\r' if sys.stdout.isatty() else '\n', flush=True)
        task_started, machine_before, own_before = time.time(), machine_busy_seconds(), own_cpu_seconds()
        result = task.run()
        seconds = time.time() - task_started
        others = (machine_busy_seconds() - machine_before - (own_cpu_seconds() - own_before)) / seconds
        results[task.key].append(dict(result, other_processes_cores=others, task_seconds=seconds))
        durations[task.key].append(seconds)
        left = sum(statistics.mean(durations[t.key]) if durations[t.key] else t.estimate for t in tasks[index:])
        warning = f'; other processes busy on {others:.1f} cores!' if others > BUSY_MACHINE_CORES else ''
        print(f'{prefix}: {task.describe(result)}  ({_duration(seconds)}; {_duration(time.time() - started)} '
              f'elapsed, ~{_duration(left)} left{warning})', flush=True)
    return results


def _rate_text(result):
    """Returns a pipeline result as '123.4 img/s on 1.9 cores'."""
    return f'{result["images_per_sec"]:.1f} img/s on {result["cores_busy"]:.1f} cores'


def conversion_tasks(data_dir, work_dir, paths, repeats, converter):
    """Tasks timing a plain read of the photos, encoded conversion, and raw conversion on 1 and all cores.

    converter: the FreshPython that converts. The last repeat leaves encoded records in
    work_dir/encoded and raw records in work_dir/raw.
    """
    cores = onu_dataset.worker_count()
    count = len(paths)
    single_dir = os.path.join(work_dir, 'raw-1-process')

    def convert(record_format, output_dir, processes, remove_after=False):
        def run():
            shutil.rmtree(output_dir, ignore_errors=True)  # our own folder, from an earlier repeat
            evict_from_page_cache(paths)
            result = converter.call('measure_conversion', data_dir=data_dir, output_dir=output_dir,
                                    record_format=record_format, processes=processes)
            if remove_after:
                shutil.rmtree(output_dir)
            return result
        return run

    def seconds_text(result):
        return f'{result["seconds"]:.2f} s'
    tasks = []
    for repeat in range(1, repeats + 1):
        suffix = f' (repeat {repeat}/{repeats})'
        tasks += [
            Task(('read_files',), f'read the {count} photos once, cold cache{suffix}',
                 lambda: measure_read_files(paths), seconds_text, 1.0),
            Task(('convert', 'encoded', cores), f'convert to encoded records{suffix}',
                 convert('encoded', os.path.join(work_dir, 'encoded'), None), seconds_text,
                 PRIOR_FRESH_PYTHON_SECONDS + count / PRIOR_IMAGES_PER_SEC['convert_encoded']),
            Task(('convert', 'raw', 1), f'convert to raw records, 1 process{suffix}',
                 convert('raw', single_dir, 1, remove_after=True), seconds_text,
                 count / PRIOR_IMAGES_PER_SEC['convert_raw']),
            Task(('convert', 'raw', cores), f'convert to raw records, {cores} processes{suffix}',
                 convert('raw', os.path.join(work_dir, 'raw'), None), seconds_text,
                 count / PRIOR_IMAGES_PER_SEC['convert_raw'] / cores * 1.5),
        ]
    return tasks


def pipeline_tasks(settings, data_dir, info_of, one_core):
    """Tasks measuring every input pipeline with eval preprocessing and with augmentation, round by round.

    info_of(way) -> the DatasetInfo that way reads; one_core: a FreshPython pinned to one CPU.
    """
    size, batch, warmup, batches = settings.image_size, settings.batch_size, settings.warmup_batches, settings.batches
    images = (warmup + batches) * batch
    estimate = 3 + images / PRIOR_IMAGES_PER_SEC['pipeline']
    serial_estimate = 3 + images / PRIOR_IMAGES_PER_SEC['serial_cv2']
    tasks = []
    for repeat in range(1, settings.repeats + 1):
        suffix = f' (repeat {repeat}/{settings.repeats})'
        tasks.append(Task(('decode_limit',), f'decode limit: one-core decode+resize{suffix}',
                          lambda: measure_decode_limit(one_core, data_dir, batch, size, warmup, batches),
                          lambda r: f'{r["single_core_images_per_sec"]:.1f} img/s x {r["cores"]} cores',
                          PRIOR_FRESH_PYTHON_SECONDS + estimate * 2))
        for augment in (False, True):
            stage = 'train' if augment else 'eval'
            what = 'training augmentation' if augment else 'eval preprocessing'
            for way in TF_DATA_WAYS if not augment else ():  # augmentation_tasks time their training
                tasks.append(Task(
                    ('pipeline', way, stage), f'{way} pipeline, {what}{suffix}',
                    lambda way=way, augment=augment: measure_pipeline(
                        info_of(way), batch, size, augment, warmup, batches),
                    _rate_text, estimate))
            tasks.append(Task(
                ('pipeline', 'serial_cv2', stage), f'serial cv2 loop, {what}{suffix}',
                lambda augment=augment: measure_serial_cv2(data_dir, batch, size, augment, warmup, batches),
                _rate_text, serial_estimate))
            # With augmentation off both Keras ways are the same pipeline: measure it once.
            for way in KERAS_WAYS if augment else KERAS_WAYS[-1:]:
                tasks.append(Task(
                    ('pipeline', way, stage),
                    f'Keras image_dataset_from_directory, {what}{KERAS_AUGMENTATION[way] if augment else ""}{suffix}',
                    lambda augmentation=way if augment else None: measure_keras_baseline(
                        data_dir, info_of('images').class_names, batch, size, augmentation, warmup, batches),
                    _rate_text, estimate))
    return tasks


def training_tasks(settings, info_of):
    """Tasks measuring each model fed by each way (repeats are windows within one session).

    The small model warms up for one epoch more, so that its windows time the pipelines' steady
    state (the decoded epoch cached); Inception-ResNet-v2's few steps all fall in the first epoch.
    """
    tasks = []
    for model_name in settings.models:
        batch = settings.train_batch_size[model_name]
        size = settings.train_image_size[model_name]
        warmup, steps = settings.train_warmup_steps[model_name], settings.train_steps[model_name]
        ways = TRAINING_WAYS
        if model_name == 'small':
            warmup += _epoch_batches(info_of('images'), batch)
            ways += SMALL_MODEL_TRAINING_WAYS
        step_seconds = (PRIOR_SEC_PER_STEP_32[model_name] * batch / 32
                        * (size / onu_model.DEFAULT_IMAGE_SIZE[model_name]) ** 2)
        estimate = PRIOR_BUILD_SECONDS[model_name] + step_seconds * (warmup + 1 + steps * settings.repeats)
        for way in ways:
            tasks.append(Task(
                ('training', model_name, way), f'train {model_name} (batch {batch}, {size}x{size}) fed by {way}',
                lambda model_name=model_name, way=way, batch=batch, size=size, warmup=warmup, steps=steps:
                    measure_training(model_name, way, info_of, batch, size, warmup, steps, settings.repeats),
                lambda r: f'{r["sec_per_batch"]:.3f} sec/batch, {r["examples_per_sec"]:.1f} examples/sec',
                estimate))
        for way in PRECISION_WAYS:
            tasks.append(Task(
                ('precision', model_name, way),
                f'train {model_name} (batch {batch}, {size}x{size}) fed by {way}: float32, mixed, XLA',
                lambda model_name=model_name, way=way, batch=batch, size=size, warmup=warmup, steps=steps:
                    measure_training_variants(model_name, way, info_of, batch, size, warmup, steps,
                                              settings.repeats, interleave=model_name == 'small'),
                lambda r: ', '.join(f'{name} {result["examples_per_sec"]:.1f}' for name, result in r.items())
                + ' examples/sec', estimate * 3))
    return tasks


def mixed_compute_dtype():
    """Returns what --precision=mixed computes in on this machine's fastest device, fast path or not.

    The benchmark turns the rewrite on even where the hardware lacks the fast path (where training
    would warn and stay float32), so that it measures what the rewrite costs there.
    """
    return 'float16' if tf.config.list_physical_devices('GPU') else 'bfloat16'


def augmentation_tasks(settings, data_dir, info_of):
    """Tasks measuring training preprocessing per mode and variant at each of AUGMENTATION_SIZES.

    Each measurement warms up for one epoch more than --warmup_batches, so that the cached variant
    is timed at its steady state; the others are timed at the same point.
    """
    batch, batches = settings.batch_size, settings.batches
    warmup = settings.warmup_batches + _epoch_batches(info_of('images'), batch)
    estimate = 3 + (warmup + batches) * batch / PRIOR_IMAGES_PER_SEC['pipeline']
    tasks = []
    for repeat in range(1, settings.repeats + 1):
        suffix = f' (repeat {repeat}/{settings.repeats})'
        for size in augmentation_sizes(settings):
            for way in TF_DATA_WAYS:
                for variant in AUGMENTATION_VARIANTS:
                    if variant == 'on_model' and way != 'encoded':
                        continue
                    if variant == 'plain_tf_image':
                        run = lambda way=way, size=size: measure_plain_tf_image(  # noqa: E731
                            info_of(way), batch, size, warmup, batches)
                    else:
                        run = lambda way=way, size=size, variant=variant: measure_pipeline(  # noqa: E731
                            info_of(way), batch, size, True, warmup, batches,
                            cache=False if variant in ('decoding', 'reduced_decode') else None,
                            augment_on='model' if variant == 'on_model' else 'input',
                            reduced_decode=variant == 'reduced_decode')
                    tasks.append(Task(('augment', way, size, variant),
                                      f'{way} training preprocessing at {size}, {variant}{suffix}',
                                      run, _cpu_ms_text, estimate))
            tasks.append(Task(('augment', 'study_serial', size, 'serial'),
                              f'the study\'s serial loop as written at {size}{suffix}',
                              lambda size=size: measure_study_serial(data_dir, batch, size, 1, batches),
                              _cpu_ms_text, 3 + (1 + batches) * batch / PRIOR_IMAGES_PER_SEC['serial_cv2']))
            tasks.append(Task(('augment', 'serial_cv2', size, 'serial'),
                              f'SerialCv2Loader (resize first, onu_input augmentation) at {size}{suffix}',
                              lambda size=size: measure_serial_cv2(data_dir, batch, size, True, 1, batches),
                              _cpu_ms_text, 3 + (1 + batches) * batch / PRIOR_IMAGES_PER_SEC['serial_cv2']))
    return tasks


def augmentation_sizes(settings):
    """Returns the image sides training preprocessing is measured at: the pipelines' and the small model's."""
    return tuple(dict.fromkeys((settings.image_size, onu_model.DEFAULT_IMAGE_SIZE['small'])))


def _cpu_ms_text(result):
    """Returns a pipeline result as '123.4 img/s on 1.9 cores = 15.4 CPU ms/img'."""
    return f'{_rate_text(result)} = {cpu_ms_per_image(result):.2f} CPU ms/img'


def cpu_ms_per_image(result):
    """Returns the CPU milliseconds one image cost in a pipeline measurement (cores busy / images per second)."""
    return 1000.0 * result['cores_busy'] / result['images_per_sec']


# ----------------------------------------------------------------------------------------------
# Data: the photos, optionally a subset, and the records made by the conversion tasks.

def prepare_photos(data_dir, work_dir, max_images_per_class):
    """Returns the photo folder to measure: data_dir, or a copy of its first photos per class and split.

    The default data dir gets the built-in sample data when it has none.
    """
    if not os.path.isdir(os.path.join(data_dir, 'train')) and (
            os.path.abspath(data_dir) == os.path.abspath(onu_flags.DEFAULT_DATA_DIR)):
        print(f'{data_dir} has no data: generating the built-in sample dataset there.', flush=True)
        make_sample_data.generate_dataset(data_dir)
    class_names = onu_dataset.find_class_names(data_dir)
    if not max_images_per_class:
        return data_dir
    subset_dir = os.path.join(work_dir, 'photos')
    for split in onu_dataset.SPLITS:
        if not os.path.isdir(os.path.join(data_dir, split)):
            continue
        per_class = collections.Counter()
        for image in onu_dataset.list_split_images(data_dir, split, class_names)[0]:
            if per_class[image.label] < max_images_per_class:
                per_class[image.label] += 1
                target_dir = os.path.join(subset_dir, split, image.class_name)
                os.makedirs(target_dir, exist_ok=True)
                shutil.copy2(image.path, target_dir)
    return subset_dir


def photo_paths(data_dir):
    """Returns the usable photos of every split of data_dir."""
    class_names = onu_dataset.find_class_names(data_dir)
    return [image.path for split in onu_dataset.SPLITS if os.path.isdir(os.path.join(data_dir, split))
            for image in onu_dataset.list_split_images(data_dir, split, class_names)[0]]


# ----------------------------------------------------------------------------------------------
# Results: rows of medians, targets, and the JSON / Markdown / PNG outputs.

def _median(results, field):
    """Returns the median of field over a list of result dicts."""
    return statistics.median(result[field] for result in results)


def assemble_rows(results, settings):
    """Returns {row name: {measure: median}} for every way and baseline (see ROW_ORDER)."""
    models = settings.models
    read = results[('read_files',)]
    source_bytes = read[0]['bytes']
    rows = {'images': {'disk_bytes': source_bytes, 'disk_ratio': 1.0, 'read_seconds': _median(read, 'seconds')},
            'serial_cv2': {'disk_bytes': source_bytes, 'disk_ratio': 1.0},
            'keras_layers': {'disk_bytes': source_bytes, 'disk_ratio': 1.0},
            'keras_reader': {'disk_bytes': source_bytes, 'disk_ratio': 1.0},
            'decode_limit': {}, 'synthetic': {}}
    rows.update({way: {} for way in SMALL_MODEL_TRAINING_WAYS})
    cores = onu_dataset.worker_count()
    for way in RECORD_WAYS:
        converted = results[('convert', way, cores)]
        rows[way] = {'disk_bytes': converted[-1]['record_bytes'],
                     'disk_ratio': converted[-1]['record_bytes'] / converted[-1]['source_bytes'],
                     'conversion_seconds': _median(converted, 'seconds'),
                     'pixel_bytes': converted[-1]['pixel_bytes']}
    rows['raw']['conversion_seconds_1_process'] = _median(results[('convert', 'raw', 1)], 'seconds')
    for way in PIPELINE_WAYS:
        for stage in ('eval', 'train'):
            measured = results.get(('pipeline', way, stage))
            if measured is None:
                continue
            rows[way][f'{stage}_images_per_sec'] = _median(measured, 'images_per_sec')
            rows[way][f'{stage}_cores_busy'] = _median(measured, 'cores_busy')
    for way in TF_DATA_WAYS:  # training: onu_input's default pipeline at its steady state
        measured = results[('augment', way, settings.image_size, 'cached')]
        rows[way]['train_images_per_sec'] = _median(measured, 'images_per_sec')
        rows[way]['train_cores_busy'] = _median(measured, 'cores_busy')
    limit = results[('decode_limit',)]
    rows['decode_limit'] = {'eval_images_per_sec': _median(limit, 'images_per_sec'), 'cores': limit[0]['cores'],
                            'single_core_images_per_sec': _median(limit, 'single_core_images_per_sec'),
                            'single_core_cores_busy': _median(limit, 'single_core_cores_busy'),
                            'cv2_single_core_images_per_sec': _median(limit, 'cv2_single_core_images_per_sec')}
    for model_name in models:
        synthetic = results[('training', model_name, 'synthetic')][0]
        for way in TRAINING_WAYS + (SMALL_MODEL_TRAINING_WAYS if model_name == 'small' else ()):
            measured = results[('training', model_name, way)][0]
            entry = {key: measured[key] for key in ('sec_per_batch', 'examples_per_sec', 'batch_size', 'image_size')}
            if way != 'synthetic':
                entry['input_bound_fraction'] = max(0.0, 1.0 - synthetic['sec_per_batch'] / measured['sec_per_batch'])
            rows[way].setdefault('training', {})[model_name] = entry
    return {name: rows[name] for name in ROW_ORDER + SMALL_MODEL_TRAINING_WAYS}


def assemble_precision(results, settings):
    """Returns {model: {'way variant': training result}} for float32, mixed and XLA rows of PRECISION_WAYS."""
    table = {}
    for model_name in settings.models:
        entries = table[model_name] = {}
        for way in PRECISION_WAYS:
            measured_variants = results[('precision', model_name, way)][0]
            for variant in ('float32',) + PRECISION_VARIANTS:
                measured = measured_variants[variant]
                entries[f'{way} {variant}'] = {name: measured[name] for name in (
                    'sec_per_batch', 'examples_per_sec', 'final_loss', 'batch_size', 'image_size',
                    'sec_per_batch_repeats')}
    return table


def assemble_augmentation(results, settings):
    """Returns {'way size variant': {images_per_sec, cores_busy, cpu_ms_per_image}} of training preprocessing."""
    table = {}
    for key, measured in results.items():
        if key[0] != 'augment':
            continue
        images_per_sec, cores_busy = _median(measured, 'images_per_sec'), _median(measured, 'cores_busy')
        table[' '.join(str(part) for part in key[1:])] = {
            'images_per_sec': images_per_sec, 'cores_busy': cores_busy,
            'cpu_ms_per_image': cpu_ms_per_image({'images_per_sec': images_per_sec, 'cores_busy': cores_busy})}
    return table


def _target(issue, text, measured, threshold, at_most=False):
    """Returns one target's verdict: measured >= threshold (or <= with at_most)."""
    passed = measured <= threshold if at_most else measured >= threshold
    return {'issue': issue, 'target': text, 'measured': measured, 'threshold': threshold,
            'comparison': '<=' if at_most else '>=', 'passed': bool(passed)}


def evaluate_targets(rows, augmentation, precision, settings, cores):
    """Returns the verdicts on the speed and size targets of issues 2, 3, 7, 12 and 13."""
    models = settings.models
    raw, encoded, images = rows['raw'], rows['encoded'], rows['images']
    targets = [
        _target(2, 'encoded records / source photo bytes', encoded['disk_ratio'], 1.002, at_most=True),
        _target(2, 'raw records / sum(H*W*3)', raw['disk_bytes'] / raw['pixel_bytes'], 1.01, at_most=True),
        _target(2, 'encoded conversion speed / reading the photos once (cold cache)',
                images['read_seconds'] / encoded['conversion_seconds'], 0.5),
        _target(2, f'raw conversion speed on {cores} cores / on 1 process',
                raw['conversion_seconds_1_process'] / raw['conversion_seconds'], 1.6),
        _target(3, 'encoded eval preprocessing / decode limit',
                encoded['eval_images_per_sec'] / rows['decode_limit']['eval_images_per_sec'], 0.8),
        _target(3, 'images eval / encoded eval', images['eval_images_per_sec'] / encoded['eval_images_per_sec'], 0.9),
        _target(3, 'raw eval / encoded eval', raw['eval_images_per_sec'] / encoded['eval_images_per_sec'], 1.0),
    ]
    for way in TF_DATA_WAYS:
        train_rate = rows[way]['train_images_per_sec']
        targets.append(_target(3, f'{way} training augmentation / serial cv2 loop, same augmentation',
                               train_rate / rows['serial_cv2']['train_images_per_sec'], 2.5))
        targets.append(_target(3, f'{way} training augmentation / Keras image_dataset_from_directory + the same '
                                  'augmentations as Keras layers',
                               train_rate / rows['keras_layers']['train_images_per_sec'], 1.2))
    for size in augmentation_sizes(settings):
        for way in TF_DATA_WAYS:
            cached, plain = augmentation[f'{way} {size} cached'], augmentation[f'{way} {size} plain_tf_image']
            targets.append(_target(12, f'{way} training preprocessing at {size}: CPU ms/img, onu_input / plain '
                                       'tf.image pipeline (the previous onu_input algorithm)',
                                   cached['cpu_ms_per_image'] / plain['cpu_ms_per_image'], 0.5, at_most=True))
            targets.append(_target(12, f'{way} training preprocessing at {size}: img/s, onu_input / plain tf.image '
                                       'pipeline', cached['images_per_sec'] / plain['images_per_sec'], 1.2))
    study = augmentation[f'study_serial {settings.image_size} serial']
    targets.append(_target(12, f'images training preprocessing at {settings.image_size}: img/s, onu_input / the '
                               'study\'s serial loop as written',
                           augmentation[f'images {settings.image_size} cached']['images_per_sec']
                           / study['images_per_sec'], 2.5))
    if 'small' in models:
        targets.append(_target(12, 'main job (small model, encoded) input-bound fraction',
                               rows['encoded']['training']['small']['input_bound_fraction'], 0.25, at_most=True))
    fast_path = bool(onu_model.detect_hardware().cpu_bfloat16_flags)
    for model_name, threshold in (('small', 1.8), ('inception_resnet_v2', 1.25)):
        if model_name in models and fast_path:
            entries = precision[model_name]
            targets.append(_target(13, f'{model_name}, model only (synthetic batch): mixed / float32 examples/sec',
                                   entries['synthetic mixed']['examples_per_sec']
                                   / entries['synthetic float32']['examples_per_sec'], threshold))
    if 'small' in models:
        main_job = (precision['small']['encoded mixed'] if fast_path else
                    rows['encoded']['training']['small'])['examples_per_sec']
        targets.append(_target(
            13, f'main job ({"mixed" if fast_path else "float32"}, encoded) / plain-TF float32 version '
                '(plain tf.image pipeline + small CNN) examples/sec',
            main_job / rows['plain_tf_image']['training']['small']['examples_per_sec'], 2.0 if fast_path else 1.5))
    if 'inception_resnet_v2' in models:
        speeds = [rows[way]['training']['inception_resnet_v2']['examples_per_sec'] for way in TF_DATA_WAYS]
        targets.append(_target(7, 'Inception-ResNet-v2: fastest / slowest of images, raw, encoded',
                               max(speeds) / min(speeds), 1.10, at_most=True))
        for way in TF_DATA_WAYS:
            targets.append(_target(7, f'Inception-ResNet-v2 input-bound fraction, {way}',
                                   rows[way]['training']['inception_resnet_v2']['input_bound_fraction'], 0.10,
                                   at_most=True))
    return targets


def hardware_info():
    """Returns the CPU model, core counts, GPUs and versions this run measured on."""
    cpu_model = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            cpu_model = next((line.split(':', 1)[1].strip() for line in f if line.startswith('model name')),
                             cpu_model)
    except OSError:
        pass
    gpus = [tf.config.experimental.get_device_details(gpu).get('device_name', gpu.name)
            for gpu in tf.config.list_physical_devices('GPU')]
    return {'cpu_model': cpu_model, 'cpu_count': os.cpu_count(), 'usable_cores': onu_dataset.worker_count(),
            'gpus': gpus, 'memory_gib': round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1),
            'tensorflow': tf.__version__, 'python': platform.python_version(), 'platform': platform.platform()}


def _megabytes(num_bytes):
    """Returns bytes as '123.4 MB' (or GB above 10 GB)."""
    return f'{num_bytes / 1e9:.2f} GB' if num_bytes >= 1e10 else f'{num_bytes / 1e6:.1f} MB'


def _cell(value, digits=1):
    """Returns a number formatted for a table, or a dash if absent."""
    return '-' if value is None else f'{value:.{digits}f}'


def _table(header, rows):
    """Returns a Markdown table."""
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(' --- ' for _ in header) + '|']
    return '\n'.join(lines + ['| ' + ' | '.join(str(cell) for cell in row) + ' |' for row in rows])


def _rate_cell(row, stage):
    """Returns 'images/sec (cores busy)' of a pipeline row's stage, or a dash if not measured."""
    if f'{stage}_images_per_sec' not in row:
        return '-'
    return f'{row[f"{stage}_images_per_sec"]:.1f} ({row[f"{stage}_cores_busy"]:.1f})'


def markdown_report(report):
    """Returns the run as Markdown: settings, the study-shaped table per model, details and targets."""
    rows, settings, hardware, others = report['rows'], report['settings'], report['hardware'], report['other_processes']
    gpus = ', '.join(hardware['gpus']) or 'no GPU'
    lines = [f'Command: `{report["command"]}`', '',
             f'Hardware: {hardware["cpu_model"]}, {hardware["usable_cores"]} cores ({hardware["cpu_count"]} CPUs), '
             f'{hardware["memory_gib"]} GiB, {gpus}; TensorFlow {hardware["tensorflow"]}, Python {hardware["python"]}. '
             f'1-minute load average {report["load_average_before"]:.2f} before the run; the run took '
             f'{_duration(report["seconds"])}. Other processes kept {others["mean_cores"]:.2f} cores busy on '
             f'average during the measurements (at most {others["max_cores"]:.2f} during one; '
             f'{others["disturbed_measurements"]} of {others["measurements"]} measurements above '
             f'{BUSY_MACHINE_CORES}).', '',
             f'Data: {settings["data_dir"]}: {report["data"]["photos"]} photos ({report["data"]["train_photos"]} '
             f'train), {_megabytes(report["data"]["source_bytes"])}. Medians of {settings["repeats"]} repeat(s); '
             f'pipelines {settings["image_size"]}x{settings["image_size"]}, batch {settings["batch_size"]}, '
             f'{settings["batches"]} timed batches after {settings["warmup_batches"]}.', '']
    for model_name in settings['models']:
        first = rows['synthetic']['training'][model_name]
        lines += [f'### The study\'s comparison: {model_name}, batch {first["batch_size"]}, '
                  f'{first["image_size"]}x{first["image_size"]}, training augmentation, '
                  f'{settings["train_steps"][model_name]} timed step(s) x {settings["repeats"]} repeat(s)', '',
                  _table(['way', 'sec/batch', 'examples/sec', 'input-bound', 'data on disk'], [
                      [ROW_TITLES[way], _cell(rows[way]['training'][model_name]['sec_per_batch'], 3),
                       _cell(rows[way]['training'][model_name]['examples_per_sec']),
                       f'{rows[way]["training"][model_name].get("input_bound_fraction", 0):.0%}'
                       if way != 'synthetic' else '-',
                       _megabytes(rows[way]['disk_bytes']) if 'disk_bytes' in rows[way] else '-']
                      for way in ('encoded', 'raw', 'images', 'serial_cv2', 'synthetic')
                      + (SMALL_MODEL_TRAINING_WAYS if model_name == 'small' else ())]), '']
    lines += ['### Storage and conversion', '',
              _table(['way', 'data on disk', 'x source', 'seconds to make', ''], [
                  [ROW_TITLES['images'], _megabytes(rows['images']['disk_bytes']), '1.000',
                   _cell(rows['images']['read_seconds'], 2), 'reading the photos once, cold cache'],
                  [ROW_TITLES['encoded'], _megabytes(rows['encoded']['disk_bytes']),
                   _cell(rows['encoded']['disk_ratio'], 3), _cell(rows['encoded']['conversion_seconds'], 2),
                   'convert_to_tfrecord.convert, cold cache'],
                  [ROW_TITLES['raw'], _megabytes(rows['raw']['disk_bytes']), _cell(rows['raw']['disk_ratio'], 3),
                   _cell(rows['raw']['conversion_seconds'], 2),
                   f'{rows["decode_limit"]["cores"]} processes; 1 process: '
                   f'{rows["raw"]["conversion_seconds_1_process"]:.2f} s']]), '',
              f'### Input pipelines: images/sec at {settings["image_size"]}x{settings["image_size"]}, '
              f'batch {settings["batch_size"]} (cores busy in brackets)', '',
              _table(['way', 'eval preprocessing', 'training augmentation'], [
                  [ROW_TITLES[way]] + [_rate_cell(rows[way], stage) for stage in ('eval', 'train')]
                  for way in PIPELINE_WAYS]
                  + [[ROW_TITLES['decode_limit'], f'{rows["decode_limit"]["eval_images_per_sec"]:.1f}', '-']]), '',
              f'One core decodes+resizes {rows["decode_limit"]["single_core_images_per_sec"]:.1f} img/s with '
              f'TensorFlow (the pipelines\' decoder; {rows["decode_limit"]["single_core_cores_busy"]:.2f} cores busy '
              f'while measured) and {rows["decode_limit"]["cv2_single_core_images_per_sec"]:.1f} img/s with cv2.', '',
              '### Precision and XLA: examples/sec (loss after the timed steps in brackets)', '',
              precision_table(report), '',
              '### Training preprocessing: CPU ms per image (images/sec in brackets)', '',
              augmentation_table(report), '',
              '### Targets', '',
              _table(['issue', 'target', 'measured', 'verdict'], [
                  [target['issue'], f'{target["target"]} {target["comparison"]} {target["threshold"]:g}',
                   f'{target["measured"]:.3f}', 'PASS' if target['passed'] else 'FAIL']
                  for target in report['targets']])]
    return '\n'.join(lines) + '\n'


def precision_table(report):
    """Returns the Markdown table of float32, mixed and XLA training, model only and end to end."""
    table_rows = []
    for model_name, entries in report['precision'].items():
        for way in PRECISION_WAYS:
            base = entries[f'{way} float32']
            cells = [f'{entries[f"{way} {variant}"]["examples_per_sec"]:.1f} '
                     f'({entries[f"{way} {variant}"]["final_loss"]:.3f})' for variant in ('float32',) + PRECISION_VARIANTS]
            speedups = [f'{entries[f"{way} {variant}"]["examples_per_sec"] / base["examples_per_sec"]:.2f}x'
                        for variant in PRECISION_VARIANTS]
            table_rows.append([f'{model_name}, batch {base["batch_size"]}, {base["image_size"]}px',
                               'model only (synthetic batch)' if way == 'synthetic' else 'end to end (encoded)']
                              + cells + speedups)
    return _table(['model', 'fed by', 'float32', 'mixed', 'XLA', 'mixed / float32', 'XLA / float32'], table_rows)


def augmentation_table(report):
    """Returns the Markdown table of training preprocessing: a row per mode and variant, a column per size."""
    augmentation, sizes = report['augmentation'], augmentation_sizes(Settings(**dict(
        report['settings'], models=tuple(report['settings']['models']))))
    titles = {'cached': 'onu_input (default: decoded epoch cached, steady state)',
              'decoding': 'onu_input, no cache (reads and decodes every image)',
              'reduced_decode': 'onu_input, no cache, JPEGs decoded at a reduced DCT scale (--reduced_decode)',
              'on_model': 'onu_input, augmentation on the model (--augment_on=model, here the CPU)',
              'plain_tf_image': 'plain tf.image pipeline (the previous onu_input algorithm)',
              'serial': ''}
    table_rows = []
    for key in dict.fromkeys(' '.join(name.split()[::2]) for name in augmentation):
        way, variant = key.split()
        title = {'study_serial': 'the study\'s serial loop as written (augments the full photo)',
                 'serial_cv2': 'SerialCv2Loader (resizes first, onu_input augmentation)'}.get(way, way)
        cells = []
        for size in sizes:
            result = augmentation.get(f'{way} {size} {variant}')
            cells.append('-' if result is None else
                         f'{result["cpu_ms_per_image"]:.2f} ({result["images_per_sec"]:.0f})')
        table_rows.append([f'{title}, {titles[variant]}'.rstrip(', ')] + cells)
    return _table(['way'] + [f'{size}x{size}' for size in sizes], table_rows)


def plot_report(report, path):
    """Draws the comparison (disk, pipeline rates, training speed per model) as a PNG at path."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    rows, models = report['rows'], report['settings']['models']
    ways = PIPELINE_WAYS
    columns = 2 if models else 1
    rows_of_plots = math.ceil((2 + len(models)) / columns)
    figure, axes = plt.subplots(rows_of_plots, columns, figsize=(7 * columns, 5 * rows_of_plots), squeeze=False)
    axes = axes.ravel()
    for axis in axes[2 + len(models):]:
        axis.set_visible(False)
    short = {'encoded': 'encoded', 'raw': 'raw', 'images': 'images\ntf.data', 'serial_cv2': 'images\nserial cv2',
             'keras_layers': 'images\nKeras\nlayers', 'keras_reader': 'images\nKeras +\nonu_input',
             'synthetic': 'synthetic'}
    axes[0].bar([short[w] for w in ('encoded', 'raw', 'images')],
                [rows[w]['disk_bytes'] / 1e6 for w in ('encoded', 'raw', 'images')], color='tab:gray')
    axes[0].set_title('data on disk (MB)')
    positions = np.arange(len(ways))
    for offset, stage, colour in ((-0.2, 'eval', 'tab:blue'), (0.2, 'train', 'tab:orange')):
        axes[1].bar(positions + offset, [rows[w].get(f'{stage}_images_per_sec', 0) for w in ways], 0.4, color=colour,
                    label='eval preprocessing' if stage == 'eval' else 'training augmentation')
    axes[1].axhline(rows['decode_limit']['eval_images_per_sec'], color='black', linestyle='--',
                    label='decode limit (eval)')
    axes[1].set_xticks(positions, [short[w] for w in ways])
    axes[1].set_title(f'input pipeline (images/sec, {report["settings"]["image_size"]}px)')
    axes[1].legend(fontsize='small')
    for axis, model_name in zip(axes[2:], models):
        training_ways = ('encoded', 'raw', 'images', 'serial_cv2', 'synthetic')
        speeds = [rows[w]['training'][model_name]['examples_per_sec'] for w in training_ways]
        bars = axis.bar([short[w] for w in training_ways], speeds,
                        color=['tab:green'] * 4 + ['tab:gray'])
        for bar, way in zip(bars, training_ways):
            bound = rows[way]['training'][model_name].get('input_bound_fraction')
            if bound is not None:
                axis.annotate(f'{bound:.0%} input-bound', (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                              ha='center', va='bottom', fontsize='small')
        first = rows['synthetic']['training'][model_name]
        axis.set_title(f'training {model_name}, batch {first["batch_size"]}, {first["image_size"]}px (examples/sec)')
    figure.suptitle(f'{report["hardware"]["cpu_model"]}, {report["hardware"]["usable_cores"]} cores, '
                    f'{", ".join(report["hardware"]["gpus"]) or "no GPU"}')
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_outputs(report, output_dir):
    """Writes <timestamp>.json, .md and .png to output_dir; returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    stem = os.path.join(output_dir, report['timestamp'])
    paths = {'json': stem + '.json', 'md': stem + '.md', 'png': stem + '.png'}
    with open(paths['json'], 'w', encoding='utf-8') as f:
        json.dump(report, f, indent=1)
        f.write('\n')
    with open(paths['md'], 'w', encoding='utf-8') as f:
        f.write(markdown_report(report))
    plot_report(report, paths['png'])
    return paths


# ----------------------------------------------------------------------------------------------
# The script.

def _per_model(values, default):
    """Returns {model: int} from model:N items, default for the models not named."""
    given = {name: int(number) for name, number in (value.split(':') for value in values)}
    return {name: given.get(name, default) for name in onu_model.MODEL_NAMES}


def _flag_or_quick(name):
    """Returns the flag's value, or the --quick setting when --quick is on and the flag was not given."""
    if FLAGS.quick and not FLAGS[name].present and name in QUICK_SETTINGS:
        return QUICK_SETTINGS[name]
    return FLAGS[name].value


def settings_from_flags():
    """Returns the Settings given by the flags."""
    models = (FLAGS.model,) if FLAGS.model else (QUICK_MODELS if FLAGS.quick else FULL_RUN_MODELS)
    return Settings(
        data_dir=FLAGS.data_dir, image_size=FLAGS.image_size or PIPELINE_IMAGE_SIZE, batch_size=FLAGS.batch_size,
        repeats=_flag_or_quick('repeats'), batches=_flag_or_quick('batches'),
        warmup_batches=_flag_or_quick('warmup_batches'), models=models,
        train_image_size={name: FLAGS.image_size or onu_model.DEFAULT_IMAGE_SIZE[name] for name in models},
        train_batch_size={name: size for name, size in _per_model(FLAGS.train_batch_size, FLAGS.batch_size).items()
                          if name in models},
        train_steps={name: steps for name, steps in _per_model(_flag_or_quick('train_steps'), 1).items()
                     if name in models},
        train_warmup_steps={name: steps for name, steps in
                            _per_model(_flag_or_quick('train_warmup_steps'), 1).items() if name in models},
        max_images_per_class=_flag_or_quick('max_images_per_class'))


def other_processes_summary(results):
    """Returns how busy processes outside the benchmark kept the machine during the measurements."""
    measured = [result for repeats in results.values() for result in repeats]
    seconds = sum(result['task_seconds'] for result in measured)
    return {'mean_cores': sum(r['other_processes_cores'] * r['task_seconds'] for r in measured) / seconds,
            'max_cores': max(r['other_processes_cores'] for r in measured),
            'disturbed_measurements': sum(r['other_processes_cores'] > BUSY_MACHINE_CORES for r in measured),
            'measurements': len(measured)}


def _load_average():
    """Returns the 1-minute load average."""
    return os.getloadavg()[0]


def benchmark(settings, work_dir):
    """Runs every measurement on settings.data_dir; returns the report (rows, targets, raw results)."""
    started, load_before = time.time(), _load_average()
    data_dir = prepare_photos(settings.data_dir, work_dir, settings.max_images_per_class)
    paths = photo_paths(data_dir)
    train_photos = onu_input.dataset_info(data_dir, 'images', 'train')
    print(f'Benchmarking {len(paths)} photos of {data_dir} ({train_photos.num_examples} train) '
          f'in {work_dir}; models: {", ".join(settings.models)}.', flush=True)

    def info_of(way):
        """The training split as way reads it: the photos, or the records converted into work_dir/way."""
        return train_photos if way == 'images' else onu_input.dataset_info(os.path.join(work_dir, way), way, 'train')
    with FreshPython(os.path.join(work_dir, 'converter.log')) as converter, \
            FreshPython(os.path.join(work_dir, 'one-core.log'), cpu=max(os.sched_getaffinity(0))) as one_core:
        results = run_tasks(conversion_tasks(data_dir, work_dir, paths, settings.repeats, converter)
                            + pipeline_tasks(settings, data_dir, info_of, one_core)
                            + augmentation_tasks(settings, data_dir, info_of)
                            + training_tasks(settings, info_of))
    rows = assemble_rows(results, settings)
    augmentation = assemble_augmentation(results, settings)
    precision = assemble_precision(results, settings)
    return {
        'timestamp': datetime.datetime.now().strftime('%Y%m%d-%H%M%S'),
        'command': ' '.join(['python onu_benchmark.py'] + [shlex.quote(arg) for arg in sys.argv[1:]]),
        'hardware': hardware_info(), 'settings': dict(dataclasses.asdict(settings), models=list(settings.models)),
        'data': {'photos': len(paths), 'train_photos': train_photos.num_examples,
                 'source_bytes': rows['images']['disk_bytes'], 'measured_dir': data_dir},
        'load_average_before': load_before, 'load_average_after': _load_average(),
        'other_processes': other_processes_summary(results),
        'seconds': time.time() - started,
        'rows': rows, 'augmentation': augmentation, 'precision': precision,
        'targets': evaluate_targets(rows, augmentation, precision, settings, onu_dataset.worker_count()),
        'measurements': {' '.join(str(part) for part in key): value for key, value in results.items()},
    }


def run():
    """Runs the benchmark given by the flags in a temporary work folder, then writes and prints the report."""
    settings = settings_from_flags()
    work_dir = tempfile.mkdtemp(prefix='onu_benchmark-', dir=FLAGS.work_dir)
    try:
        report = benchmark(settings, work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    paths = write_outputs(report, FLAGS.output_dir)
    print()
    print(markdown_report(report))
    print(f'Wrote {paths["json"]}, {paths["md"]} and {paths["png"]}.')


def main(argv):
    return onu_flags.run_script(run, argv)


if __name__ == '__main__':
    app.run(main)
