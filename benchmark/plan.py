"""What one onu_benchmark.py run measures: its Settings, the ways of feeding, and the task list in run order
(benchmark_runner.Tasks: a label, a benchmark_measure call, a result text, an estimate; repeats share a key)."""
import dataclasses
import math
import os
import shutil

from benchmark import measure as benchmark_measure
from benchmark.runner import Task
from onu_lib import onu_dataset
from onu_lib import onu_decoded_cache
from onu_lib import onu_pool
import onu_model

RECORD_WAYS = ('raw', 'encoded')
TF_DATA_WAYS = ('images',) + RECORD_WAYS
TRAINING_WAYS = TF_DATA_WAYS + ('serial_cv2', 'synthetic')
# Issue 13's: each model fed a synthetic batch (the model alone) and the encoded pipeline (end to end),
# in float32, mixed precision and with XLA, measured side by side.
PRECISION_WAYS = ('synthetic', 'encoded')
# Issue 12's comparison, measured with the small model only (Inception-ResNet-v2 is not input-bound here).
SMALL_MODEL_TRAINING_WAYS = ('encoded_decoding', 'encoded_on_model', 'plain_tf_image', 'study_serial')
# Issue 20's: the same photos as the Inception/ImageNet converter's shards, trained on side by side with this
# repo's encoded records (their windows alternated), with the small model.
LAYOUT_WAYS = ('encoded', 'inception')
LAYOUT_MODEL = 'small'
# Issue 21's: the main-job rows fed by tf.data, whose logged input wait must rank them as their input-bound
# fraction does; and what tracing one step per log line (--log_frequency's default) costs the main job.
WAIT_RANKED_WAYS = ('encoded', 'encoded_decoding', 'plain_tf_image')
FEED_DICT_WAYS = ('serial_cv2', 'study_serial')  # fed before each step: no iterator wait to measure
# Each training way as the HParams table's settings (onu_hparams.SETTINGS names) of a training run fed that way; the
# baselines that are not onu_input pipelines say only what they read. The benchmark's photos fit in the decoded
# epoch cache, so onu_input's default keeps it.
TRAINING_WAY_SETTINGS = {
    'images': {'data_format': 'images', 'augment_on': 'input', 'decoded_epoch_cache': 'memory'},
    'raw': {'data_format': 'raw', 'augment_on': 'input', 'decoded_epoch_cache': 'memory'},
    'encoded': {'data_format': 'encoded', 'augment_on': 'input', 'decoded_epoch_cache': 'memory'},
    'serial_cv2': {'data_format': 'images'},
    'synthetic': {},
    'encoded_decoding': {'data_format': 'encoded', 'augment_on': 'input', 'decoded_epoch_cache': 'off'},
    'encoded_on_model': {'data_format': 'encoded', 'augment_on': 'model', 'decoded_epoch_cache': 'memory'},
    'plain_tf_image': {'data_format': 'images'},
    'study_serial': {'data_format': 'images'},
    'inception': {'data_format': 'encoded', 'layout': 'inception', 'augment_on': 'input', 'decoded_epoch_cache': 'memory'},
}
WAIT_TRACE_EVERY = 10
# Issue 24's: the main job's model trained, and the pipeline alone at the pipelines' size, with the pipeline here or
# on one tf.data service worker (benchmark_measure.DATA_SERVICE_PLACEMENTS).
DATA_SERVICE_MODEL = 'small'
# An H100-class GPU's Inception-ResNet-v2 training rate in mixed precision, estimated from published tables (issue 24):
# not measured here (no GPU); the report turns the measured CPU ms per image into the cores that feed it.
GPU_IMAGES_PER_SEC = 800
DATA_SERVICE_MIN_WARMUP = 10   # steps or batches
DATA_SERVICE_MIN_WINDOW = 20
# variant -> what feeds: onu_input's default (decoded epoch cached in memory), the decoded epoch cached on local
# disk, onu_input decoding every image exactly or at a reduced DCT scale, onu_input with augmentation placed on the
# model, and the plain tf.image pipeline.
AUGMENTATION_VARIANTS = ('cached', 'disk', 'decoding', 'reduced_decode', 'on_model', 'plain_tf_image')
KERAS_WAYS = ('keras_layers', 'keras_reader')
KERAS_AUGMENTATION = {'keras_layers': ' by Keras layers', 'keras_reader': ' by onu_input'}
PIPELINE_WAYS = ('encoded', 'raw', 'images', 'serial_cv2') + KERAS_WAYS  # in table and plot order
# Issue 13's question (why the small model gains little from bfloat16) is asked of this model.
PROFILED_MODEL = 'small'
# Rough costs for the progress estimate, replaced by measured durations as the run goes (a model's: its
# onu_model.ModelSpec prior_sec_per_step_32 and prior_build_seconds).
PRIOR_IMAGES_PER_SEC = {'pipeline': 150.0, 'serial_cv2': 60.0, 'convert_raw': 80.0, 'convert_encoded': 400.0}
PRIOR_FRESH_PYTHON_SECONDS = 5.0  # starting a FreshPython (it imports TensorFlow) at its first call


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
    step_profile_steps: int  # traced steps of PROFILED_MODEL per precision
    count_shards: int = 1000      # the synthetic set of other tools' shards that is found and counted
    count_records: int = 100000
    validation_percent: float = onu_dataset.DEFAULT_VALIDATION_PERCENT  # bare class folders: split as training does
    labels_offset: int = None     # a folder of other tools' records: as training reads them


def _rate_text(result):
    """Returns a pipeline result as '123.4 img/s on 1.9 cores'."""
    return f'{result["images_per_sec"]:.1f} img/s on {result["cores_busy"]:.1f} cores'


def _cpu_ms_text(result):
    """Returns a pipeline result as '123.4 img/s on 1.9 cores = 15.4 CPU ms/img'."""
    return f'{_rate_text(result)} = {benchmark_measure.cpu_ms_per_image(result):.2f} CPU ms/img'


def _seconds_text(result):
    """Returns a storage result as '1.23 s'."""
    return f'{result["seconds"]:.2f} s'


def _epoch_batches(info, batch_size):
    """Returns how many training batches make one epoch of info."""
    return math.ceil(info.num_examples / batch_size)


def augmentation_sizes(pipeline_image_size):
    """Returns the image sides training preprocessing is measured at: the pipelines' and the small model's."""
    return tuple(dict.fromkeys((pipeline_image_size, onu_model.MODELS['small'].image_size)))


def conversion_tasks(data_dir, work_dir, paths, repeats, converter):
    """Tasks timing a plain read of the photos, encoded conversion, and raw conversion on 1 and all cores in the
    FreshPython converter; the last repeat leaves encoded records in work_dir/encoded and raw ones in work_dir/raw."""
    cores = onu_pool.worker_count()
    count = len(paths)
    single_dir = os.path.join(work_dir, 'raw-1-process')

    def convert(record_format, output_dir, processes, remove_after=False):
        """Returns the () -> result of one conversion into output_dir from a cold page cache."""
        def run():
            shutil.rmtree(output_dir, ignore_errors=True)  # our own folder, from an earlier repeat
            benchmark_measure.evict_from_page_cache(paths)
            result = converter.call('measure_conversion', data_dir=data_dir, output_dir=output_dir,
                                    record_format=record_format, processes=processes)
            if remove_after:
                shutil.rmtree(output_dir)
            return result
        return run

    tasks = []
    for repeat in range(1, repeats + 1):
        suffix = f' (repeat {repeat}/{repeats})'
        tasks += [
            Task(('read_files',), f'read the {count} photos once, cold cache{suffix}',
                 lambda: benchmark_measure.measure_read_files(paths), _seconds_text, 1.0),
            Task(('convert', 'encoded', cores), f'convert to encoded records{suffix}',
                 convert('encoded', os.path.join(work_dir, 'encoded'), None), _seconds_text,
                 PRIOR_FRESH_PYTHON_SECONDS + count / PRIOR_IMAGES_PER_SEC['convert_encoded']),
            Task(('convert', 'raw', 1), f'convert to raw records, 1 process{suffix}',
                 convert('raw', single_dir, 1, remove_after=True), _seconds_text,
                 count / PRIOR_IMAGES_PER_SEC['convert_raw']),
            Task(('convert', 'raw', cores), f'convert to raw records, {cores} processes{suffix}',
                 convert('raw', os.path.join(work_dir, 'raw'), None), _seconds_text,
                 count / PRIOR_IMAGES_PER_SEC['convert_raw'] / cores * 1.5),
        ]
    tasks.append(Task(('write_inception',), 'write the photos as Inception/ImageNet shards (build_image_data.py layout)',
                      lambda: benchmark_measure.write_inception_shards(data_dir, os.path.join(work_dir, 'encoded'),
                                                                       os.path.join(work_dir, 'inception')),
                      _seconds_text, count / PRIOR_IMAGES_PER_SEC['convert_encoded']))
    return tasks


def counting_tasks(settings, work_dir):
    """Tasks finding and counting a synthetic set of TF-slim shards as training does: cold, then cached."""
    folder = os.path.join(work_dir, 'counting', 'shards')
    what = f'{settings.count_shards} shards, {settings.count_records} records'
    return [Task(('count_records', state), f'find and count {what}, {state}',
                 lambda cold=state == 'cold': benchmark_measure.measure_record_counting(
                     folder, settings.count_shards, settings.count_records, cold),
                 _seconds_text, 2.0 + settings.count_records / 20000)
            for state in ('cold', 'cached')]


def pipeline_tasks(settings, data_dir, info_of, one_core):
    """Tasks measuring every input pipeline with eval preprocessing and with augmentation, round by round."""
    size, batch, warmup, batches = settings.image_size, settings.batch_size, settings.warmup_batches, settings.batches
    images = (warmup + batches) * batch
    estimate = 3 + images / PRIOR_IMAGES_PER_SEC['pipeline']
    serial_estimate = 3 + images / PRIOR_IMAGES_PER_SEC['serial_cv2']
    tasks = []
    for repeat in range(1, settings.repeats + 1):
        suffix = f' (repeat {repeat}/{settings.repeats})'
        tasks.append(Task(('decode_limit',), f'decode limit: one-core decode+resize{suffix}',
                          lambda: benchmark_measure.measure_decode_limit(one_core, data_dir, batch, size, warmup,
                                                                         batches),
                          lambda r: f'{r["single_core_images_per_sec"]:.1f} img/s x {r["cores"]} cores',
                          PRIOR_FRESH_PYTHON_SECONDS + estimate * 2))
        for augment in (False, True):
            stage = 'train' if augment else 'eval'
            what = 'training augmentation' if augment else 'eval preprocessing'
            for way in TF_DATA_WAYS if not augment else ():  # augmentation_tasks time their training
                tasks.append(Task(
                    ('pipeline', way, stage), f'{way} pipeline, {what}{suffix}',
                    lambda way=way, augment=augment: benchmark_measure.measure_pipeline(
                        info_of(way), batch, size, augment, warmup, batches),
                    _rate_text, estimate))
            tasks.append(Task(
                ('pipeline', 'serial_cv2', stage), f'serial cv2 loop, {what}{suffix}',
                lambda augment=augment: benchmark_measure.measure_serial_cv2(data_dir, batch, size, augment, warmup,
                                                                             batches),
                _rate_text, serial_estimate))
            # With augmentation off both Keras ways are the same pipeline: measure it once.
            for way in KERAS_WAYS if augment else KERAS_WAYS[-1:]:
                tasks.append(Task(
                    ('pipeline', way, stage),
                    f'Keras image_dataset_from_directory, {what}{KERAS_AUGMENTATION[way] if augment else ""}{suffix}',
                    lambda augmentation=way if augment else None: benchmark_measure.measure_keras_baseline(
                        data_dir, info_of('images').class_names, batch, size, augmentation, warmup, batches),
                    _rate_text, estimate))
    return tasks


def _disk_cache(info, size, cache_root):
    """Returns the onu_decoded_cache.DiskCache of info at size under cache_root: written by the first measurement's
    first epoch, read by the others."""
    cache = onu_decoded_cache.DiskCache.open(cache_root, info, size, False, seed=0)
    if cache is None:
        raise RuntimeError(f'{cache_root}: no room for the decoded epoch of {info.data_dir} at {size} (--work_dir)')
    return cache


def _augmentation_run(info_of, way, variant, batch, size, warmup, batches, cache_root):
    """Returns the () -> result of one training preprocessing measurement: way read as variant says (the disk cache
    under cache_root)."""
    if variant == 'plain_tf_image':
        return lambda: benchmark_measure.measure_plain_tf_image(info_of(way), batch, size, warmup, batches)
    if variant == 'disk':
        return lambda: benchmark_measure.measure_pipeline(info_of(way), batch, size, True, warmup, batches,
                                                          cache=_disk_cache(info_of(way), size, cache_root))
    return lambda: benchmark_measure.measure_pipeline(
        info_of(way), batch, size, True, warmup, batches,
        cache=onu_decoded_cache.NO_CACHE if variant in ('decoding', 'reduced_decode') else None,
        augment_on='model' if variant == 'on_model' else 'input',
        reduced_decode=variant == 'reduced_decode')


def augmentation_tasks(settings, data_dir, info_of, work_dir):
    """Tasks measuring training preprocessing per mode and variant at each of augmentation_sizes, after one epoch
    more than --warmup_batches: the cached variants at their steady state (the disk cache in work_dir/decoded)."""
    batch, batches = settings.batch_size, settings.batches
    warmup = settings.warmup_batches + _epoch_batches(info_of('images'), batch)
    estimate = 3 + (warmup + batches) * batch / PRIOR_IMAGES_PER_SEC['pipeline']
    serial_estimate = 3 + (1 + batches) * batch / PRIOR_IMAGES_PER_SEC['serial_cv2']
    tasks = []
    for repeat in range(1, settings.repeats + 1):
        suffix = f' (repeat {repeat}/{settings.repeats})'
        for size in augmentation_sizes(settings.image_size):
            for way in TF_DATA_WAYS:
                for variant in AUGMENTATION_VARIANTS:
                    if variant == 'on_model' and way != 'encoded':
                        continue
                    tasks.append(Task(('augment', way, size, variant),
                                      f'{way} training preprocessing at {size}, {variant}{suffix}',
                                      _augmentation_run(info_of, way, variant, batch, size, warmup, batches,
                                                        os.path.join(work_dir, 'decoded')),
                                      _cpu_ms_text, estimate))
            tasks.append(Task(('augment', 'study_serial', size, 'serial'),
                              f'the study\'s serial loop as written at {size}{suffix}',
                              lambda size=size: benchmark_measure.measure_study_serial(data_dir, batch, size, 1,
                                                                                       batches),
                              _cpu_ms_text, serial_estimate))
            tasks.append(Task(('augment', 'serial_cv2', size, 'serial'),
                              f'SerialCv2Loader (resize first, onu_input augmentation) at {size}{suffix}',
                              lambda size=size: benchmark_measure.measure_serial_cv2(data_dir, batch, size, True, 1,
                                                                                     batches),
                              _cpu_ms_text, serial_estimate))
    return tasks


def _training_estimate(settings, model_name, steps):
    """Returns the prior seconds of building model_name's training graph and running steps steps."""
    batch, size = settings.train_batch_size[model_name], settings.train_image_size[model_name]
    spec = onu_model.model_spec(model_name)
    step_seconds = spec.prior_sec_per_step_32 * batch / 32 * (size / spec.image_size) ** 2
    return spec.prior_build_seconds + step_seconds * steps


def _examples_per_sec_text(result):
    """Returns a side-by-side training result as 'float32 12.3, mixed 14.5 examples/sec'."""
    return ', '.join(f'{name} {run["examples_per_sec"]:.1f}' for name, run in result.items()) + ' examples/sec'


def _training_task(settings, info_of, model_name, way, warmup):
    """The task timing model_name's training fed by way after warmup steps, settings.repeats windows."""
    batch, size = settings.train_batch_size[model_name], settings.train_image_size[model_name]
    steps = settings.train_steps[model_name]
    return Task(('training', model_name, way), f'train {model_name} (batch {batch}, {size}x{size}) fed by {way}',
                lambda: benchmark_measure.measure_training(model_name, way, info_of, batch, size, warmup, steps,
                                                           settings.repeats),
                lambda r: f'{r["sec_per_batch"]:.3f} sec/batch, {r["examples_per_sec"]:.1f} examples/sec',
                _training_estimate(settings, model_name, warmup + 1 + steps * settings.repeats))


def training_tasks(settings, info_of):
    """Tasks measuring each model fed by each way (repeats are windows within one session).

    The small model warms up for one epoch more, so that its windows time the pipelines with the decoded epoch
    cached; Inception-ResNet-v2's few steps all fall in the first epoch."""
    tasks = []
    for model_name in settings.models:
        batch, size = settings.train_batch_size[model_name], settings.train_image_size[model_name]
        warmup, steps = settings.train_warmup_steps[model_name], settings.train_steps[model_name]
        ways = TRAINING_WAYS
        if model_name == 'small':
            warmup += _epoch_batches(info_of('images'), batch)
            ways += SMALL_MODEL_TRAINING_WAYS
        tasks += [_training_task(settings, info_of, model_name, way, warmup) for way in ways]
        estimate = _training_estimate(settings, model_name, warmup + 1 + steps * settings.repeats)
        for way in PRECISION_WAYS:
            tasks.append(Task(
                ('precision', model_name, way),
                f'train {model_name} (batch {batch}, {size}x{size}) fed by {way}: float32, mixed, XLA',
                lambda model_name=model_name, way=way, batch=batch, size=size, warmup=warmup, steps=steps:
                    benchmark_measure.measure_training_variants(model_name, way, info_of, batch, size, warmup, steps,
                                                      settings.repeats, interleave=model_name == 'small'),
                _examples_per_sec_text, estimate * 3))
    if LAYOUT_MODEL in settings.models:
        tasks += _main_job_side_by_side_tasks(settings, info_of)
    return tasks


def _main_job_side_by_side_tasks(settings, info_of):
    """Tasks training LAYOUT_MODEL (the main job's) two ways at once, windows alternated: Inception/ImageNet shards
    next to encoded records (issue 20), and with and without a step traced for its input wait (issue 21)."""
    model_name = LAYOUT_MODEL
    batch, size = settings.train_batch_size[model_name], settings.train_image_size[model_name]
    warmup = settings.train_warmup_steps[model_name] + _epoch_batches(info_of('images'), batch)
    steps, repeats = settings.train_steps[model_name], settings.repeats
    measures = {
        'layout': (f'fed by {" and ".join(LAYOUT_WAYS)}', lambda: benchmark_measure.measure_training_side_by_side(
            model_name, LAYOUT_WAYS, info_of, batch, size, warmup, steps, repeats)),
        'wait_tracing': (f'fed by encoded, with and without a step traced for its input wait every '
                         f'{WAIT_TRACE_EVERY}', lambda: benchmark_measure.measure_wait_tracing(
                             model_name, 'encoded', info_of, batch, size, warmup, steps, repeats, WAIT_TRACE_EVERY)),
    }
    return [Task((key, model_name), f'train {model_name} (batch {batch}, {size}x{size}) {what}, side by side', run,
                 _examples_per_sec_text, _training_estimate(settings, model_name, warmup + 1 + steps * repeats) * 2)
            for key, (what, run) in measures.items()]


def step_profile_tasks(settings, info_of):
    """The task tracing PROFILED_MODEL's steps on an in-memory batch, float32 and mixed (none if not measured)."""
    if PROFILED_MODEL not in settings.models:
        return []
    model_name = PROFILED_MODEL
    batch, size = settings.train_batch_size[model_name], settings.train_image_size[model_name]
    warmup, steps = settings.train_warmup_steps[model_name], settings.step_profile_steps
    return [Task(
        ('step_profile', model_name),
        f'profile {model_name} (batch {batch}, {size}x{size}) steps by kind of op: float32, mixed',
        lambda: benchmark_measure.measure_step_profile(model_name, info_of, batch, size, warmup, steps),
        lambda r: f'{r["float32"]["step_ms"]:.1f} ms/step float32, {r["mixed"]["step_ms"]:.1f} mixed',
        2 * _training_estimate(settings, model_name, warmup + 3 * steps))]  # a traced step costs about two


def records_tasks(settings, formats, info_of):
    """Tasks measuring a folder of records (no photos): each format it holds, eval and training, per model."""
    size, batch, warmup, batches = settings.image_size, settings.batch_size, settings.warmup_batches, settings.batches
    estimate = 3 + (warmup + batches) * batch / PRIOR_IMAGES_PER_SEC['pipeline']
    tasks = []
    for repeat in range(1, settings.repeats + 1):
        for data_format in formats:
            for augment, stage in ((False, 'eval'), (True, 'train')):
                tasks.append(Task(
                    ('pipeline', data_format, stage), f'{data_format} pipeline, {stage} (repeat {repeat}/{settings.repeats})',
                    lambda data_format=data_format, augment=augment: benchmark_measure.measure_pipeline(
                        info_of(data_format), batch, size, augment, warmup, batches), _rate_text, estimate))
    for model_name in settings.models:
        tasks += [_training_task(settings, info_of, model_name, way, settings.train_warmup_steps[model_name])
                  for way in formats + ('synthetic',)]
    return tasks


def data_service_tasks(settings, info_of, work_dir):
    """The task training DATA_SERVICE_MODEL and reading the pipeline alone, with the pipeline here and on one local
    tf.data service worker (none if that model is not measured)."""
    if DATA_SERVICE_MODEL not in settings.models:
        return []
    model_name = DATA_SERVICE_MODEL
    batch, size = settings.train_batch_size[model_name], settings.train_image_size[model_name]
    # Windows long enough that the batches buffered on either side of the network (full after the warm-up) are
    # a small part of what a window counts, even in a --quick run.
    warmup = max(settings.train_warmup_steps[model_name], DATA_SERVICE_MIN_WARMUP)
    steps, repeats = max(settings.train_steps[model_name], DATA_SERVICE_MIN_WINDOW), settings.repeats
    pipeline_warmup = max(settings.warmup_batches, DATA_SERVICE_MIN_WARMUP)
    pipeline_batches = max(settings.batches, DATA_SERVICE_MIN_WINDOW)
    placements = len(benchmark_measure.DATA_SERVICE_PLACEMENTS)
    pipeline_seconds = (pipeline_warmup + pipeline_batches) * settings.batch_size / PRIOR_IMAGES_PER_SEC['pipeline']
    return [Task(
        ('data_service', model_name),
        f'train {model_name} (batch {batch}, {size}x{size}) and read the pipeline alone ({settings.image_size}x'
        f'{settings.image_size}) with it here and on a tf.data service worker',
        lambda: benchmark_measure.measure_data_service(
            model_name, info_of, batch, size, warmup, steps, repeats, settings.batch_size, settings.image_size,
            pipeline_warmup, pipeline_batches, work_dir),
        lambda r: ', '.join(f'{placement} {result["trainer_cpu_ms_per_image"]:.2f}'
                            for placement, result in r['pipeline'].items()) + ' trainer CPU ms/img',
        30 + placements * (_training_estimate(settings, model_name, warmup + steps * repeats) + pipeline_seconds))]
