"""What onu_benchmark.py measures: each measure_* function builds one thing, times it, returns a dict of numbers.

Its parts: storage (reading, converting, counting records), input pipelines (images/sec, CPU cores busy), training
(sec/batch fed by one way, per precision, where a step's time goes) and the tf.data service. Functions that
benchmark_runner.FreshPython runs in another process take and return JSON values only.
"""
import collections
import contextlib
import os
import re
import resource
import statistics
import subprocess
import sys
import time

from PIL import Image

import numpy as np
import tensorflow as tf

from benchmark import baselines as benchmark_baselines
from onu_lib import onu_data_service
from onu_lib import onu_dataset
from onu_lib import onu_decoded_cache
from onu_lib import onu_files
from onu_lib import onu_pool
import onu_input
from onu_lib import onu_launch
from onu_lib import onu_layouts
from onu_lib import onu_layout_writer
from onu_lib import onu_tfrecord
import onu_model
from onu_lib import onu_converter
from onu_lib import onu_precision
from onu_lib import onu_training

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRECISION_VARIANTS = ('mixed', 'xla')  # measured next to float32 by measure_training_variants
TRAINING_VARIANTS = ('float32',) + PRECISION_VARIANTS
# measure_step_profile's kinds of op, in table order, and its two precisions.
STEP_KINDS = ('forward_conv', 'input_gradient_conv', 'weight_gradient_conv', 'batch_norm', 'other')
STEP_PROFILE_PRECISIONS = {'float32': 'float32', 'mixed': 'bfloat16'}
# Device names of a GPU trace's copies of the same ops (streams, memory copies): not counted twice.
DUPLICATE_TRACE_DEVICES = ('/stream:', '/memcpy')


# ----------------------------------------------------------------------------------------------
# Storage: reading the photos, converting them.

def _own_peak_rss_mb():
    """This process's own peak resident memory in MB (VmHWM): ru_maxrss also keeps the peak of the process it was
    forked from, across exec."""
    with open('/proc/self/status', encoding='ascii') as f:
        return int(re.search(r'VmHWM:\s+(\d+) kB', f.read()).group(1)) / 1024


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

    Run it in a FreshPython, so that its worker processes start as convert_to_tfrecord.py's do."""
    started = time.perf_counter()
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), output_dir, formats=(record_format,),
                                     processes=processes)
    seconds = time.perf_counter() - started
    entries = [formats[record_format] for formats in manifest['splits'].values()]
    return {'seconds': seconds, 'processes': onu_pool.worker_count(processes),
            'records': sum(entry['records'] for entry in entries),
            'record_bytes': sum(entry['record_bytes'] for entry in entries),
            'source_bytes': sum(entry['source_bytes'] for entry in entries),
            'pixel_bytes': sum(entry['pixel_bytes'] for entry in entries)}


def write_inception_shards(data_dir, encoded_dir, output_dir):
    """Writes data_dir's photos as the Inception/ImageNet converter (build_image_data.py) does; returns seconds, bytes.

    As many shards per split as the encoded records in encoded_dir: the same photos and bytes, another layout."""
    started = time.perf_counter()
    manifest = onu_dataset.read_manifest(encoded_dir)
    data = onu_dataset.describe(data_dir)
    images, class_names = [], None
    for split in onu_dataset.SPLITS:
        info = data.split(split, 'images')
        class_names = info.class_names
        for path, label in zip(info.files, info.labels):
            with open(path, 'rb') as f, Image.open(path) as image:
                images.append(onu_layout_writer.StoredImage(split, label, f.read(), image.width, image.height,
                                                      os.path.basename(path)))
    onu_layout_writer.write_records(onu_layouts.layout_named('inception'), output_dir, images, class_names,
                              num_shards={split: len(manifest['splits'][split]['encoded']['shards'])
                                          for split in onu_dataset.SPLITS}, names_file=False)
    paths = [os.path.join(output_dir, name) for name in os.listdir(output_dir)]
    return {'seconds': time.perf_counter() - started, 'bytes': sum(os.path.getsize(path) for path in paths),
            'files': len(paths)}


def _synthetic_shards(folder, num_shards, num_records):
    """Writes num_records small records in num_shards TF-slim-named shards (and labels.txt) into folder, once."""
    if os.path.isfile(os.path.join(folder, onu_dataset.LABELS_FILENAME)):
        return
    os.makedirs(folder, exist_ok=True)
    payload = bytes(1000)
    for index in range(num_shards):
        count = num_records // num_shards + (index < num_records % num_shards)
        onu_tfrecord.write_records(os.path.join(folder, f'synthetic_train_{index:05d}-of-{num_shards:05d}.tfrecord'),
                                   (onu_tfrecord.serialize_example({'image/encoded': payload, 'image/class/label': record % 2})
                                    for record in range(count)))
    with open(os.path.join(folder, onu_dataset.LABELS_FILENAME), 'w', encoding='utf-8') as f:
        f.write('0:even\n1:odd\n')


def measure_record_counting(folder, num_shards, num_records, cold):
    """Seconds to find and count a synthetic set of TF-slim shards as training does (onu_layouts), and the count.

    cold: from an empty count cache and a cold page cache; otherwise with the counts an earlier call cached."""
    _synthetic_shards(folder, num_shards, num_records)
    cache_dir = os.path.join(os.path.dirname(folder), 'count-cache')
    if cold:
        evict_from_page_cache([os.path.join(folder, name) for name in os.listdir(folder)])
        index = os.path.join(cache_dir, onu_layouts.INDEX_SUBDIR)
        for name in os.listdir(index) if os.path.isdir(index) else ():
            os.remove(os.path.join(index, name))
    saved = os.environ.get(onu_files.CACHE_DIR_ENV)
    os.environ[onu_files.CACHE_DIR_ENV] = cache_dir
    try:
        started = time.perf_counter()
        record_set = onu_dataset.describe(folder).foreign.record_set('train', 'encoded')
        seconds = time.perf_counter() - started
    finally:
        if saved is None:
            os.environ.pop(onu_files.CACHE_DIR_ENV)
        else:
            os.environ[onu_files.CACHE_DIR_ENV] = saved
    return {'seconds': seconds, 'records': record_set.num_examples, 'shards': len(record_set.files)}


# ----------------------------------------------------------------------------------------------
# Input pipelines: images/sec and the CPU cores they keep busy.

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
    return tf.compat.v1.Session(config=config or onu_precision.session_config())


def cpu_ms_per_image(result):
    """Returns the CPU milliseconds one image cost in a pipeline measurement (cores busy / images per second)."""
    return 1000.0 * result['cores_busy'] / result['images_per_sec']


def auto_cache(info, image_size):
    """Returns the decoded-epoch cache of a measurement that names none: memory when the epoch fits
    onu_input.DECODED_CACHE_BYTES, else none."""
    fits = onu_input.decoded_epoch_bytes(info.num_examples, image_size) <= onu_input.DECODED_CACHE_BYTES
    return onu_decoded_cache.MemoryCache(info.num_examples) if fits else onu_decoded_cache.NO_CACHE


def _training_batches(info, batch_size, image_size, cache, on_model, data_service=None):
    """Returns onu_input's training batches of info with every augmentation, made here with cache or by the tf.data
    service at data_service; on_model: with their draws, for augment_batch after the pipeline (--augment_on=model)."""
    augment = None if on_model else onu_input.AugmentOptions.default()
    if data_service:
        return onu_input.service_batches(info, batch_size, image_size, onu_input.ServiceJob(data_service),
                                         augment=augment)
    return onu_input.training_batches(info, batch_size, image_size, cache, augment=augment)


def measure_pipeline(info, batch_size, image_size, augment, warmup, batches, cache=None, augment_on='input',
                     reduced_decode=False):
    """Images/sec of onu_input's pipeline over info: training (augment) or eval preprocessing (repeated).

    cache: an onu_decoded_cache cache (None: auto_cache's); augment_on='model' runs augment_batch after the
    pipeline, as --augment_on=model does."""
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            if augment:
                dataset = onu_input.training_batches(
                    info, batch_size, image_size, cache or auto_cache(info, image_size), reduced_decode=reduced_decode,
                    augment=None if augment_on == 'model' else onu_input.AugmentOptions.default())
            else:
                dataset = onu_input.eval_batches(info, batch_size, image_size).repeat()
            batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        images, labels = batch[:2]
        fetch = _consumed(images, labels)
        if augment_on == 'model':
            # Grappler drops a control dependency on a stateless op: make the labels depend on its data.
            augmented = onu_input.augment_batch(images, batch[2])
            fetch = fetch + tf.cast(tf.reduce_max(augmented) > 1.0, tf.int32)  # never true: adds 0
        with _session() as sess:
            return _time_runs(sess, fetch, warmup, batches)


def measure_cache_mode(data_dir, data_format, batch_size, image_size, mode, cache_root, batches):
    """The training pipeline of data_dir's train split with the decoded epoch kept as mode says (memory, disk under
    cache_root, or off), in a fresh process: its first epoch's seconds, then images/sec and CPU after a second epoch
    (the disk cache's first read) and a few batches more, and the process's peak resident memory."""
    info = onu_dataset.describe(data_dir).split('train', data_format)
    cache = onu_decoded_cache.open_cache(mode, info, image_size, cache_root, seed=0)
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            dataset = onu_input.training_batches(info, batch_size, image_size, cache, seed=0,
                                                 augment=onu_input.AugmentOptions.default())
            fetch = _consumed(*tf.compat.v1.data.make_one_shot_iterator(dataset).get_next())
        with _session() as sess:
            epoch_batches = info.num_examples // batch_size
            first = _time_runs(sess, fetch, 0, epoch_batches)
            result = _time_runs(sess, fetch, epoch_batches + 5, batches)
    return dict(result, cpu_ms_per_image=cpu_ms_per_image(result), first_epoch_seconds=first['seconds'],
                peak_rss_mb=_own_peak_rss_mb(),
                epoch_mb=onu_input.decoded_epoch_bytes(info.num_examples, image_size) / 2**20)


def measure_plain_tf_image(info, batch_size, image_size, warmup, batches):
    """Images/sec of benchmark_baselines.plain_tf_image_dataset over info."""
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            dataset = benchmark_baselines.plain_tf_image_dataset(info, batch_size, image_size)
            fetch = _consumed(*tf.compat.v1.data.make_one_shot_iterator(dataset).get_next())
        with _session() as sess:
            return _time_runs(sess, fetch, warmup, batches)


def _time_fed_loader(loader, warmup, batches):
    """Times warmup + batches batches fed by a serial loader (StudySerialLoop, SerialCv2Loader) in this graph."""
    fetch = _consumed(loader.images, loader.labels)
    with _session() as sess:
        return _time_runs(sess, fetch, warmup, batches, feeds=loader.feed_dicts())


def measure_study_serial(data_dir, batch_size, image_size, warmup, batches):
    """Images/sec of benchmark_baselines.StudySerialLoop."""
    with tf.Graph().as_default():
        return _time_fed_loader(benchmark_baselines.StudySerialLoop(data_dir, batch_size, image_size), warmup, batches)


def measure_serial_cv2(data_dir, batch_size, image_size, augment, warmup, batches):
    """Images/sec of the study's loader: cv2 reads one file at a time, feed_dict ships the batch."""
    with tf.Graph().as_default():
        loader = benchmark_baselines.SerialCv2Loader(data_dir, 'train', batch_size, image_size, augment=augment)
        return _time_fed_loader(loader, warmup, batches)


def measure_keras_baseline(data_dir, class_names, batch_size, image_size, augmentation, warmup, batches):
    """Images/sec of benchmark_baselines.keras_dataset (Keras's own folder reader + the augmentation)."""
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            dataset = benchmark_baselines.keras_dataset(data_dir, class_names, batch_size, image_size, augmentation)
            # Keras's random layers keep their seed in a variable: a one-shot iterator cannot hold it.
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            fetch = _consumed(*iterator.get_next())
        with _session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
            return _time_runs(sess, fetch, warmup, batches)


# ----------------------------------------------------------------------------------------------
# The decode limit: what every core decoding and resizing at the one-core rate would give.

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
    """Images/sec of decode+resize of data_dir's training photos on one thread: TensorFlow (the pipelines' decoder)
    and cv2 (the serial loop's). Run it in a FreshPython pinned to one CPU, so that no helper thread uses another."""
    info = onu_dataset.describe(data_dir).split('train', 'images')
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
    cores = onu_pool.worker_count()
    single = one_core.call('measure_single_core_decode', data_dir=data_dir, batch_size=batch_size,
                           image_size=image_size, warmup=warmup, batches=batches)
    return {'images_per_sec': cores * single['images_per_sec'], 'cores': cores,
            'single_core_images_per_sec': single['images_per_sec'], 'single_core_cores_busy': single['cores_busy'],
            'cv2_single_core_images_per_sec': single['cv2_images_per_sec']}


def _cv2_single_core_rate(info, image_size, num_images):
    """Images/sec of the serial loader's cv2 read+resize on one thread, over num_images of info's files."""
    import cv2  # pylint: disable=import-outside-toplevel  (only the baselines use OpenCV)
    with tf.Graph().as_default():
        read_image = benchmark_baselines.SerialCv2Loader(info.data_dir, 'train', 1, image_size).read_image
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


# ----------------------------------------------------------------------------------------------
# Training: sec/batch of the training graph fed by one way.

def _synthetic_inputs(batch_size, image_size, num_classes):
    """Returns an in-memory (images, labels) batch: a variable set once, so a step reads no input."""
    images = tf.compat.v1.Variable(
        tf.random.uniform([batch_size, image_size, image_size, 3], -1.0, 1.0), trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], name='synthetic_images')
    labels = tf.constant(np.arange(batch_size) % num_classes, tf.int32)
    return images.read_value(), labels


def training_inputs(way, info_of, batch_size, image_size, data_service=None):
    """Returns (images, labels, feeds) of one way, with every training augmentation; feeds None or an iterator.

    info_of(way) -> the DatasetInfo that way reads; data_service: the tf.data service address that makes the
    onu_input ways' batches."""
    photos = info_of('images')
    if way == 'synthetic':
        return _synthetic_inputs(batch_size, image_size, photos.num_classes) + (None,)
    if way in ('serial_cv2', 'study_serial'):
        if way == 'serial_cv2':
            loader = benchmark_baselines.SerialCv2Loader(photos.data_dir, 'train', batch_size, image_size,
                                                         augment=True)
        else:
            loader = benchmark_baselines.StudySerialLoop(photos.data_dir, batch_size, image_size)
        return loader.images, loader.labels, loader.feed_dicts()
    with tf.device(onu_input.PIPELINE_DEVICE):
        if way == 'plain_tf_image':
            dataset = benchmark_baselines.plain_tf_image_dataset(photos, batch_size, image_size)
        else:
            info = info_of(way.split('_')[0])
            cache = onu_decoded_cache.NO_CACHE if way == 'encoded_decoding' else auto_cache(info, image_size)
            dataset = _training_batches(info, batch_size, image_size, cache, way == 'encoded_on_model', data_service)
        batch = onu_input.next_batch(dataset)  # as training reads it (its tf.data model with it)
    if way == 'encoded_on_model':
        return onu_input.augment_batch(batch[0], batch[2]), batch[1], None
    return batch[0], batch[1], None


def _train_op(model_name, total_loss, global_step, num_examples_per_epoch, batch_size, compute_dtype):
    """Returns onu_train's train op with its defaults: momentum, exponential decay, moving averages."""
    learning_rate = onu_model.make_learning_rate(global_step, onu_model.model_spec(model_name).learning_rate,
                                                 'exponential', num_examples_per_epoch, batch_size)
    optimizer = onu_model.make_optimizer('momentum', learning_rate, compute_dtype=compute_dtype)
    grads_and_vars = optimizer.compute_gradients(total_loss, var_list=onu_model.variables_to_train(None))
    return onu_model.build_train_op(optimizer, grads_and_vars, global_step)


class TrainingRun:
    """A training graph of model_name fed by way, in its own session: run warmup, then time windows.

    trace_every: trace every N-th step for its input wait as training's LoggerHook does (None: never)."""

    def __init__(self, model_name, way, info_of, batch_size, image_size, compute_dtype='float32', xla=False,
                 trace_every=None, data_service=None):
        info = info_of('images')
        self.graph = tf.Graph()
        with self.graph.as_default():
            images, labels, self._feeds = training_inputs(way, info_of, batch_size, image_size, data_service)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            logits, end_points = onu_model.inference(images, info.num_classes, model_name, is_training=True)
            total_loss = onu_model.loss(logits, labels, end_points)
            train_op = _train_op(model_name, total_loss, global_step, info.num_examples, batch_size, compute_dtype)
            self._step = [train_op, total_loss]  # one fetch list throughout: a new one sets up a new executor
            self._pipelines = tf.compat.v1.get_collection(onu_input.PIPELINE_MODEL_OPS)
            self.session = _session(
                onu_precision.set_precision_options(onu_precision.session_config(), compute_dtype, xla))
            self.session.run([tf.compat.v1.global_variables_initializer(),
                              tf.compat.v1.local_variables_initializer()])
        self.windows, self.final_loss = [], None
        self._trace_every, self._steps_run, self.wait_fractions = trace_every, 0, []
        self._pipeline_work = []  # onu_input.PipelineWork at each waiting step

    def _run_step(self, options=None, run_metadata=None):
        """Runs one training step (traced when options ask for it)."""
        feed = next(self._feeds) if self._feeds else None
        _, self.final_loss = self.session.run(self._step, feed, options=options, run_metadata=run_metadata)

    def waiting_step(self):
        """Runs one step with a software trace, as training's LoggerHook does; records its input wait fraction and
        the input pipelines' work so far (for work_per_batch)."""
        run_metadata = tf.compat.v1.RunMetadata()
        self._run_step(onu_training.traced_run_options(), run_metadata)
        self.wait_fractions.append(onu_training.input_wait_fraction(run_metadata))
        self._pipeline_work.append(onu_input.pipeline_work(self.session.run(self._pipelines)))

    def work_per_batch(self):
        """The input pipelines' seconds of work per batch from the first to the last waiting step, as training's
        LoggerHook measures it between two log lines (None without two waiting steps or a pipeline)."""
        between = [onu_input.work_between(before, after)
                   for before, after in zip(self._pipeline_work, self._pipeline_work[1:])]
        batches = sum(batches for _, batches in between)
        return sum(seconds for seconds, _ in between) / batches if batches > 0 else None

    def run(self, steps):
        """Runs steps training steps (every trace_every-th traced for its input wait)."""
        for _ in range(steps):
            self._steps_run += 1
            if self._trace_every and self._steps_run % self._trace_every == 0:
                self.waiting_step()
            else:
                self._run_step()

    def time_window(self, steps):
        """Times steps training steps; appends their sec/batch to windows."""
        started = time.perf_counter()
        self.run(steps)
        self.windows.append((time.perf_counter() - started) / steps)

    def traced_step(self):
        """Runs one step with a full trace; returns its RunMetadata (step_stats: every op's times)."""
        run_metadata = tf.compat.v1.RunMetadata()
        self._run_step(tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata)
        return run_metadata

    def close(self):
        """Closes the session."""
        self.session.close()

    def result(self, batch_size, image_size):
        """Returns the median window and the details as a result dict; closes the session."""
        self.close()
        sec_per_batch = statistics.median(self.windows)
        result = {'sec_per_batch': sec_per_batch, 'examples_per_sec': batch_size / sec_per_batch,
                  'sec_per_batch_repeats': self.windows, 'batch_size': batch_size, 'image_size': image_size,
                  'final_loss': float(self.final_loss)}
        if self.wait_fractions:
            result.update(wait_fraction=statistics.median(self.wait_fractions), wait_fractions=self.wait_fractions)
        if self.work_per_batch() is not None:
            result['work_ms_per_batch'] = 1000 * self.work_per_batch()
        return result


def _interleaved_windows(runs, warmup, steps, repeats):
    """Warms up every TrainingRun of runs, then alternates their timed windows (a slow spell slows them alike)."""
    for run in runs.values():
        run.run(warmup)
    for _ in range(repeats):
        for run in runs.values():
            run.time_window(steps)


WAIT_TRACED_STEPS = 10  # steps traced after the timed windows for the input wait training would log


def measure_training(model_name, way, info_of, batch_size, image_size, warmup, steps, repeats, **options):
    """Sec/batch of training model_name fed by way: the median over repeats of steps steps each.

    options: TrainingRun's compute_dtype and xla. WAIT_TRACED_STEPS traced steps follow for wait_fraction."""
    run = TrainingRun(model_name, way, info_of, batch_size, image_size, **options)
    return _interleaved_results({way: run}, warmup, steps, repeats, batch_size, image_size, WAIT_TRACED_STEPS)[way]


def measure_wait_tracing(model_name, way, info_of, batch_size, image_size, warmup, steps, repeats, trace_every):
    """{untraced, traced: measure_training's result}: training with and without a traced step every trace_every,
    their timed windows alternated: what measuring the input wait for every log line costs."""
    runs = {'untraced': TrainingRun(model_name, way, info_of, batch_size, image_size),
            'traced': TrainingRun(model_name, way, info_of, batch_size, image_size, trace_every=trace_every)}
    return _interleaved_results(runs, warmup, steps, repeats, batch_size, image_size)


def mixed_compute_dtype():
    """Returns what --precision=mixed computes in on this machine's fastest device, fast path or not (training
    would stay float32 without it; the benchmark measures what the rewrite costs there)."""
    return 'float16' if onu_precision.visible_gpus() else 'bfloat16'


def measure_training_variants(model_name, way, info_of, batch_size, image_size, warmup, steps, repeats,
                              interleave):
    """{variant: measure_training's result} for float32, mixed and XLA training; interleave: alternate the timed
    windows of three open sessions, else one after the other (a model too large to hold three times)."""
    options = {'float32': {}, 'mixed': {'compute_dtype': mixed_compute_dtype()}, 'xla': {'xla': True}}
    if not interleave:
        return {name: measure_training(model_name, way, info_of, batch_size, image_size, warmup, steps,
                                       repeats, **options[name]) for name in TRAINING_VARIANTS}
    runs = {name: TrainingRun(model_name, way, info_of, batch_size, image_size, **options[name])
            for name in TRAINING_VARIANTS}
    return _interleaved_results(runs, warmup, steps, repeats, batch_size, image_size)


def _interleaved_results(runs, warmup, steps, repeats, batch_size, image_size, wait_steps=0):
    """{name: TrainingRun.result} of runs timed in alternating windows (_interleaved_windows), each then running
    wait_steps steps traced for their input wait."""
    _interleaved_windows(runs, warmup, steps, repeats)
    for run in runs.values():
        for _ in range(wait_steps):
            run.waiting_step()
    return {name: run.result(batch_size, image_size) for name, run in runs.items()}


def measure_training_side_by_side(model_name, ways, info_of, batch_size, image_size, warmup, steps, repeats):
    """{way: measure_training's result} of model_name fed by each of ways, their timed windows alternated."""
    runs = {way: TrainingRun(model_name, way, info_of, batch_size, image_size) for way in ways}
    return _interleaved_results(runs, warmup, steps, repeats, batch_size, image_size, WAIT_TRACED_STEPS)


# ----------------------------------------------------------------------------------------------
# Where one training step's time goes (issue 13): op times from a full trace, summed by kind.

def op_kind(op_type):
    """Returns the STEP_KINDS entry an op type counts under (oneDNN's renamed types, e.g. _MklNativeConv2D, too)."""
    name = op_type.lower()
    if 'conv' in name and 'backpropinput' in name:
        return 'input_gradient_conv'
    if 'conv' in name and 'backpropfilter' in name:
        return 'weight_gradient_conv'
    if 'conv2d' in name or 'conv3d' in name:
        return 'forward_conv'
    if 'batchnorm' in name:  # FusedBatchNormV3, _MklNativeFusedBatchNormEx, ...GradV3
        return 'batch_norm'
    return 'other'


def _op_type(node_stats):
    """Returns the op type of a traced node, from its timeline label 'name = Type(inputs)'."""
    label = node_stats.timeline_label
    return label.partition(' = ')[2].partition('(')[0] if ' = ' in label else 'unknown'


def _op_seconds(node_stats):
    """Returns how long a traced node's kernel ran (op end - op start), from nanoseconds where recorded."""
    if node_stats.op_end_rel_nanos:  # the microsecond fields round a short op to 0
        return (node_stats.op_end_rel_nanos - node_stats.op_start_rel_nanos) / 1e9
    return (node_stats.op_end_rel_micros - node_stats.op_start_rel_micros) / 1e6


def _traced_nodes(run_metadata):
    """Yields the NodeExecStats of one traced step, each op once."""
    for device in run_metadata.step_stats.dev_stats:
        if not any(part in device.device for part in DUPLICATE_TRACE_DEVICES):
            yield from device.node_stats


def op_seconds_by_type(run_metadata):
    """Returns {op type: seconds its kernels ran} summed over one traced step's ops."""
    seconds = collections.Counter()
    for node in _traced_nodes(run_metadata):
        seconds[_op_type(node)] += _op_seconds(node)
    return seconds


def bfloat16_op_types(run_metadata):
    """Returns the sorted op types of a traced step that output bfloat16 tensors (what the rewrite converted)."""
    return sorted({_op_type(node) for node in _traced_nodes(run_metadata)
                   if any(output.tensor_description.dtype == tf.bfloat16.as_datatype_enum for output in node.output)})


def _step_profile_summary(run, traces, steps):
    """Returns a TrainingRun's untraced step time and its traced op times, in ms per step, by kind and type."""
    by_type = collections.Counter()
    for trace in traces:
        by_type.update(op_seconds_by_type(trace))
    by_kind = {kind: 0.0 for kind in STEP_KINDS}
    for op_type, seconds in by_type.items():
        by_kind[op_kind(op_type)] += 1000.0 * seconds / len(traces)
    return {'step_ms': 1000.0 * statistics.median(run.windows), 'ops_ms': sum(by_kind.values()),
            'kinds_ms': by_kind, 'traced_steps': len(traces), 'timed_steps': steps,
            'bfloat16_op_types': bfloat16_op_types(traces[-1]),
            'op_types_ms': {op_type: 1000.0 * seconds / len(traces) for op_type, seconds in by_type.most_common()}}


def measure_step_profile(model_name, info_of, batch_size, image_size, warmup, steps):
    """Where one training step of model_name on an in-memory batch spends its time, float32 and mixed.

    Each run times one untraced window of steps, then traces steps steps (op times summed by STEP_KINDS and op
    type: ops overlap on several threads, so their sum can exceed the wall clock); the two runs alternate."""
    runs = {name: TrainingRun(model_name, 'synthetic', info_of, batch_size, image_size, compute_dtype=dtype)
            for name, dtype in STEP_PROFILE_PRECISIONS.items()}
    _interleaved_windows(runs, warmup, steps, repeats=1)
    traces = {name: [] for name in runs}
    for _ in range(steps):
        for name, run in runs.items():
            traces[name].append(run.traced_step())
    for run in runs.values():
        run.close()
    return dict({name: _step_profile_summary(run, traces[name], steps) for name, run in runs.items()},
                model=model_name, batch_size=batch_size, image_size=image_size, warmup_steps=warmup,
                compute_dtypes=dict(STEP_PROFILE_PRECISIONS))


# ----------------------------------------------------------------------------------------------
# The tf.data service (issue 24): the same pipeline on this process's cores, or on a service worker's.

# placement -> (the onu_input way, on the service): the pipeline here without the cache (what a dataset too large
# for it costs), on one service worker augmenting there, and on it with the augmentation on the model.
DATA_SERVICE_PLACEMENTS = {'local': ('encoded_decoding', False), 'service': ('encoded_decoding', True),
                           'service_on_model': ('encoded_on_model', True)}
SERVICE_START_SECS = 180


def _process_cpu_seconds(pid):
    """Returns the CPU seconds process pid has used (utime + stime)."""
    with open(f'/proc/{pid}/stat', encoding='ascii', errors='replace') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _loopback_bytes():
    """Returns the bytes the loopback interface has carried (received) so far: what the service sent on this machine."""
    with open('/proc/net/dev', encoding='ascii') as f:
        for line in f:
            name, _, counters = line.partition(':')
            if name.strip() == 'lo':
                return int(counters.split()[0])
    raise OSError('no loopback interface in /proc/net/dev')


@contextlib.contextmanager
def local_data_service(work_dir):
    """Runs run_data_service.py with one worker here, on a free port; yields (its address, the worker's pid)."""
    port = onu_launch.free_ports('127.0.0.1', 1)[0]
    log_path = os.path.join(work_dir, 'data-service.log')
    with open(log_path, 'w') as log:
        process = subprocess.Popen([sys.executable, os.path.join(REPO_DIR, 'run_data_service.py'), '--num_workers=1',
                                    f'--port={port}', f'--work_dir={os.path.join(work_dir, "dispatcher")}'],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=REPO_DIR)
    try:
        address = f'grpc://127.0.0.1:{port}'
        onu_data_service.wait_for_workers(address, 1, SERVICE_START_SECS)
        with open(log_path) as log:
            worker = next(line for line in log if line.startswith('started worker 0 (pid '))
        yield address, int(worker.split('(pid ')[1].split(')')[0])
    finally:
        process.terminate()
        process.wait(timeout=60)


class _Accounting:
    """Sums, over timed windows, this process's CPU seconds, a service worker's and the loopback bytes."""

    def __init__(self, worker_pid):
        self._worker_pid = worker_pid
        self.totals = collections.Counter()

    def _counters(self):
        return {'trainer_cpu': _cpu_seconds(), 'bytes': _loopback_bytes(),
                'worker_cpu': _process_cpu_seconds(self._worker_pid) if self._worker_pid else 0.0}

    @contextlib.contextmanager
    def window(self):
        before = self._counters()
        yield
        self.totals.update({name: value - before[name] for name, value in self._counters().items()})

    def per_image(self, images):
        """Returns CPU ms per image here and on the worker, and the bytes per image the loopback carried."""
        return {'trainer_cpu_ms_per_image': 1000.0 * self.totals['trainer_cpu'] / images,
                'worker_cpu_ms_per_image': 1000.0 * self.totals['worker_cpu'] / images,
                'bytes_per_example': self.totals['bytes'] / images, 'images': images}


def _service_training(model_name, way, info_of, batch_size, image_size, warmup, steps, repeats, address, worker_pid):
    """Trains model_name fed by way (on the service at address, or here without one); returns measure_training's
    result with the CPU per image here and on the worker, and the bytes per example sent."""
    run = TrainingRun(model_name, way, info_of, batch_size, image_size, data_service=address)
    accounting = _Accounting(worker_pid)
    run.run(warmup)
    for _ in range(repeats):
        with accounting.window():
            run.time_window(steps)
    return dict(run.result(batch_size, image_size), **accounting.per_image(repeats * steps * batch_size))


def _service_pipeline(way, info, batch_size, image_size, warmup, batches, address, worker_pid):
    """Reads batches of way's pipeline alone (on the service at address, or here); returns its images/sec with the
    CPU per image here and on the worker, and the bytes per example sent."""
    with tf.Graph().as_default():
        with tf.device(onu_input.PIPELINE_DEVICE):
            dataset = _training_batches(info, batch_size, image_size, onu_decoded_cache.NO_CACHE,
                                        way == 'encoded_on_model', address)
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()[:2]
        fetch, accounting = _consumed(images, labels), _Accounting(worker_pid)
        with _session() as sess:
            for _ in range(warmup):
                sess.run(fetch)
            with accounting.window():
                rate = _time_runs(sess, fetch, 0, batches)
    return dict(rate, **accounting.per_image(rate['images']))


def measure_data_service(model_name, info_of, train_batch_size, train_image_size, warmup, steps, repeats,
                         pipeline_batch_size, pipeline_image_size, pipeline_warmup, pipeline_batches, work_dir):
    """{'training': {placement: ...}, 'pipeline': {placement: ...}} for each of DATA_SERVICE_PLACEMENTS: model_name
    trained on encoded records without the decoded-epoch cache, and the pipeline alone, with the CPU ms per image
    of the trainer and of the one service worker (on the same cores here), and the bytes per example sent."""
    results = {'training': {}, 'pipeline': {}}
    with local_data_service(work_dir) as (address, worker_pid):
        for placement, (way, on_service) in DATA_SERVICE_PLACEMENTS.items():
            service = (address, worker_pid) if on_service else (None, None)
            results['training'][placement] = _service_training(
                model_name, way, info_of, train_batch_size, train_image_size, warmup, steps, repeats, *service)
            results['pipeline'][placement] = _service_pipeline(
                way, info_of('encoded'), pipeline_batch_size, pipeline_image_size, pipeline_warmup, pipeline_batches,
                *service)
    return dict(results, model=model_name, warmup_steps=warmup, steps=steps, repeats=repeats,
                warmup_batches=pipeline_warmup, batches=pipeline_batches)
