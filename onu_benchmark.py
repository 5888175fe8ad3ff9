"""Measures the three ways to feed photos (images, raw, encoded) next to the study's baselines.

The study fed 3,562 ONU photos to Inception-ResNet-v2 three ways and found the original images 10x
slower (the GPU idle ~90% of the time). This script repeats that comparison on any photo folder, in
one run, and shows where the time goes:
  storage      bytes on disk and the ratio to the photos; seconds to convert, next to the seconds
               to read the photos once (both from a cold page cache);
  pipelines    images/sec of the tf.data pipelines (onu_input.eval_batches, training_batches) with eval preprocessing
               and with every training augmentation, next to the study's serial cv2 loop, Keras's
               image_dataset_from_directory + the same augmentations (as Keras layers, and as
               onu_input's own function), and the decode limit (cores x the one-core decode+resize
               rate of the same files);
  training     sec/batch of each model fed by each way and by a synthetic in-memory batch;
               input-bound fraction = max(0, 1 - synthetic sec/batch / sec/batch): the share of a
               step lost to input (the study's "GPU idle", as a number);
  step profile where one step of the small model on an in-memory batch spends its time, by kind of
               op, in float32 and with oneDNN's bfloat16 rewrite (issue 13).
Writes <output_dir>/<timestamp>.json, .md and .png, and prints the Markdown tables. This script holds
the flags and the order of a run; its parts are in the package benchmark/.

    python onu_benchmark.py                       # /tmp/onu_data (made if missing), both models
    python onu_benchmark.py --quick               # a short run on a subset, small model only
    python onu_benchmark.py --data_dir=RECORDS    # a folder of records (other tools'): the formats it holds
"""
from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)

import dataclasses
import datetime
import os
import shlex
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmark import plan as benchmark_plan
from benchmark import report as benchmark_report
from benchmark import runner as benchmark_runner
from onu_lib import onu_dataset
from onu_lib import onu_flags
from onu_lib import onu_pool
import onu_model

FLAGS = flags.FLAGS
onu_flags.define_model_flags()  # --data_dir (photos or records), --model, --image_size, --batch_size, ...

PIPELINE_IMAGE_SIZE = 299  # the study's input size; pipelines use it unless --image_size is given


def per_model_steps(field, at_most=None):
    """Returns a model:N item for every registered model, N its ModelSpec field (at most at_most if given)."""
    items = []
    for name, spec in onu_model.MODELS.items():
        steps = getattr(spec, field)
        items.append(f'{name}:{steps if at_most is None else min(steps, at_most)}')
    return items


QUICK_SETTINGS = {'repeats': 1, 'batches': 3, 'warmup_batches': 1, 'max_images_per_class': 32,
                  'train_steps': per_model_steps('benchmark_steps', at_most=3),
                  'train_warmup_steps': per_model_steps('benchmark_warmup_steps', at_most=1), 'step_profile_steps': 2,
                  'count_shards': 20, 'count_records': 2000}
# Every registered model, the quickest first (its rows come first in the report).
FULL_RUN_MODELS = tuple(sorted(onu_model.MODELS, key=lambda name: onu_model.MODELS[name].prior_sec_per_step_32))
QUICK_MODELS = ('small',)
MEASUREMENT_MODULE = 'benchmark.measure'  # what the FreshPython processes run

flags.DEFINE_string('output_dir', 'benchmark_results',
                    'Where <timestamp>.json, .md and .png go (created if missing).')
flags.DEFINE_string('work_dir', None,
                    'Parent of the temporary folder for the converted records (about 12x the photos '
                    'while raw conversion is timed); default: the system temp folder. Removed at the end.')
flags.DEFINE_integer('repeats', 3, 'Repeats of every measurement; tables show medians.', lower_bound=1)
flags.DEFINE_integer('batches', 20, 'Timed batches per input-pipeline measurement.', lower_bound=1)
flags.DEFINE_integer('warmup_batches', 5, 'Untimed batches before each input-pipeline measurement.',
                     lower_bound=0)
flags.DEFINE_list('train_steps', per_model_steps('benchmark_steps'), 'model:N timed training steps per repeat.')
flags.DEFINE_list('train_warmup_steps', per_model_steps('benchmark_warmup_steps'),
                  'model:N untimed training steps first (the first steps set up the graph).')
flags.DEFINE_list('train_batch_size', [], 'model:N batch size for training; default --batch_size.')
flags.DEFINE_integer('step_profile_steps', 10,
                     'Traced training steps of the small model per precision for the table of where its step '
                     'time goes (issue 13), after its --train_warmup_steps and as many untraced timed steps.',
                     lower_bound=1)
flags.DEFINE_integer('max_images_per_class', 0,
                     'Use at most this many photos per class in each split (copied to the work folder); '
                     '0 = all.', lower_bound=0)
flags.DEFINE_integer('count_shards', 1000, 'Shards of the synthetic set of other tools\' records that is found and '
                     'counted as training does (onu_layouts), from a cold start and from the count cache.', lower_bound=1)
flags.DEFINE_integer('count_records', 100000, 'Records of that synthetic set.', lower_bound=1)
flags.DEFINE_boolean('data_service_only', False,
                     'Measure only the tf.data service\'s part (issue 24): the main job\'s model and the pipeline '
                     'alone, with the pipeline here and on one local service worker (about 5 minutes).')
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
                                     f'e.g. {",".join(per_model_steps("benchmark_steps"))}')


def _per_model(values, default, models):
    """Returns {model: int} of models from model:N items, default for the models not named."""
    given = {name: int(number) for name, number in (value.split(':') for value in values)}
    return {name: given.get(name, default) for name in onu_model.MODEL_NAMES if name in models}


def _flag_or_quick(name):
    """Returns the flag's value, or the --quick setting when --quick is on and the flag was not given."""
    if FLAGS.quick and not FLAGS[name].present and name in QUICK_SETTINGS:
        return QUICK_SETTINGS[name]
    return FLAGS[name].value


def settings_from_flags():
    """Returns the benchmark_plan.Settings given by the flags."""
    models = (FLAGS.model,) if FLAGS.model else (QUICK_MODELS if FLAGS.quick else FULL_RUN_MODELS)
    return benchmark_plan.Settings(
        data_dir=FLAGS.data_dir, image_size=FLAGS.image_size or PIPELINE_IMAGE_SIZE, batch_size=FLAGS.batch_size,
        repeats=_flag_or_quick('repeats'), batches=_flag_or_quick('batches'),
        warmup_batches=_flag_or_quick('warmup_batches'), models=models,
        train_image_size={name: FLAGS.image_size or onu_model.MODELS[name].image_size for name in models},
        train_batch_size=_per_model(FLAGS.train_batch_size, FLAGS.batch_size, models),
        train_steps=_per_model(_flag_or_quick('train_steps'), 1, models),
        train_warmup_steps=_per_model(_flag_or_quick('train_warmup_steps'), 1, models),
        max_images_per_class=_flag_or_quick('max_images_per_class'),
        step_profile_steps=_flag_or_quick('step_profile_steps'), count_shards=_flag_or_quick('count_shards'),
        count_records=_flag_or_quick('count_records'), validation_percent=FLAGS.validation_percent,
        labels_offset=FLAGS.labels_offset)


def _report(settings, started, load_before, results, **parts):
    """Returns the report of a run: what ran where, the parts given and every raw measurement."""
    return dict({
        'timestamp': datetime.datetime.now().strftime('%Y%m%d-%H%M%S'),
        'command': ' '.join(['python onu_benchmark.py'] + [shlex.quote(arg) for arg in sys.argv[1:]]),
        'hardware': benchmark_runner.hardware_info(),
        'settings': dict(dataclasses.asdict(settings), models=list(settings.models)),
        'load_average_before': load_before, 'load_average_after': os.getloadavg()[0],
        'other_processes': benchmark_runner.other_processes_summary(results),
        'seconds': time.time() - started,
        'measurements': {' '.join(str(part) for part in key): value for key, value in results.items()},
    }, **parts)


def benchmark_records(settings, work_dir, data):
    """Measures a folder of records (no photos): each format it holds in the eval and training pipelines and
    training each model, next to a synthetic batch; and finding and counting the synthetic set of shards."""
    started, load_before = time.time(), os.getloadavg()[0]
    data_dir = settings.data_dir
    layout, formats = data.layout, data.record_formats
    print(f'Benchmarking the {", ".join(formats)} records of {data_dir} ({layout}) in {work_dir}; models: '
          f'{", ".join(settings.models)}.', flush=True)

    def info_of(way):
        """The training split in way's format (the first format's for synthetic and images: its classes)."""
        return data.split('train', way if way in formats else formats[0])
    results = benchmark_runner.run_tasks(benchmark_plan.counting_tasks(settings, work_dir)
                                         + benchmark_plan.records_tasks(settings, formats, info_of))
    train = info_of(formats[0])
    return _report(settings, started, load_before, results, kind='records', layout=layout,
                   data={'records': train.num_examples, 'class_names': list(train.class_names),
                         'measured_dir': data_dir},
                   rows=benchmark_report.assemble_records_rows(results, settings, formats,
                                                               {fmt: info_of(fmt) for fmt in formats}),
                   record_counting=benchmark_report.assemble_counting(results, settings))


def _photos(settings, work_dir):
    """Prepares the photos measured; returns (their folder, their paths, the train split's DatasetInfo, info_of:
    the training split as a way reads it: the photos, or the records converted or written into work_dir/way)."""
    data_dir = benchmark_runner.prepare_photos(settings.data_dir, work_dir, settings.max_images_per_class,
                                               settings.validation_percent)
    paths = benchmark_runner.photo_paths(data_dir)
    train_photos = onu_dataset.describe(data_dir).split('train', 'images')
    print(f'Benchmarking {len(paths)} photos of {data_dir} ({train_photos.num_examples} train) '
          f'in {work_dir}; models: {", ".join(settings.models)}.', flush=True)

    def info_of(way):
        if way == 'images':
            return train_photos
        return onu_dataset.describe(os.path.join(work_dir, way)).split(
            'train', 'encoded' if way == 'inception' else way)
    return data_dir, paths, train_photos, info_of


def benchmark_data_service(settings, work_dir):
    """Measures only the tf.data service's part (--data_service_only) on the photos, converted to encoded records
    first (not timed); returns its report."""
    started, load_before = time.time(), os.getloadavg()[0]
    data_dir, paths, train_photos, info_of = _photos(settings, work_dir)
    with benchmark_runner.FreshPython(MEASUREMENT_MODULE, os.path.join(work_dir, 'converter.log')) as converter:
        converter.call('measure_conversion', data_dir=data_dir, output_dir=os.path.join(work_dir, 'encoded'),
                       record_format='encoded', processes=None)
    results = benchmark_runner.run_tasks(benchmark_plan.data_service_tasks(settings, info_of, work_dir))
    return _report(settings, started, load_before, results, kind='data_service',
                   data={'photos': len(paths), 'train_photos': train_photos.num_examples,
                         'source_bytes': sum(os.path.getsize(path) for path in paths), 'measured_dir': data_dir},
                   data_service=benchmark_report.assemble_data_service(results))


def benchmark(settings, work_dir):
    """Runs every measurement on settings.data_dir; returns the report (rows, targets, raw results)."""
    data = onu_dataset.describe(settings.data_dir, labels_offset=settings.labels_offset) if os.path.isdir(
        settings.data_dir) else None
    if data is not None and not data.has_photos and data.record_formats:
        return benchmark_records(settings, work_dir, data)
    if FLAGS.data_service_only:
        return benchmark_data_service(settings, work_dir)
    started, load_before = time.time(), os.getloadavg()[0]
    data_dir, paths, train_photos, info_of = _photos(settings, work_dir)
    with benchmark_runner.FreshPython(MEASUREMENT_MODULE, os.path.join(work_dir, 'converter.log')) as converter, \
            benchmark_runner.FreshPython(MEASUREMENT_MODULE, os.path.join(work_dir, 'one-core.log'),
                                         cpu=max(os.sched_getaffinity(0))) as one_core:
        results = benchmark_runner.run_tasks(
            benchmark_plan.conversion_tasks(data_dir, work_dir, paths, settings.repeats, converter)
            + benchmark_plan.counting_tasks(settings, work_dir)
            + benchmark_plan.pipeline_tasks(settings, data_dir, info_of, one_core)
            + benchmark_plan.augmentation_tasks(settings, data_dir, info_of, work_dir)
            + benchmark_plan.training_tasks(settings, info_of)
            + benchmark_plan.step_profile_tasks(settings, info_of)
            + benchmark_plan.data_service_tasks(settings, info_of, work_dir))
    rows = benchmark_report.assemble_rows(results, settings)
    augmentation = benchmark_report.assemble_augmentation(results)
    precision = benchmark_report.assemble_precision(results, settings)
    return _report(settings, started, load_before, results, kind='photos',
                   data={'photos': len(paths), 'train_photos': train_photos.num_examples,
                         'source_bytes': rows['images']['disk_bytes'], 'measured_dir': data_dir},
                   rows=rows, augmentation=augmentation, precision=precision,
                   record_counting=benchmark_report.assemble_counting(results, settings),
                   wait_tracing=benchmark_report.assemble_wait_tracing(results),
                   step_profile=benchmark_report.assemble_step_profile(results),
                   data_service=benchmark_report.assemble_data_service(results),
                   targets=benchmark_report.evaluate_targets(rows, augmentation, precision, settings,
                                                             onu_pool.worker_count()))


def run():
    """Runs the benchmark given by the flags in a temporary work folder, then writes and prints the report."""
    settings = settings_from_flags()
    work_dir = tempfile.mkdtemp(prefix='onu_benchmark-', dir=FLAGS.work_dir)
    try:
        report = benchmark(settings, work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    paths = benchmark_report.write_outputs(report, FLAGS.output_dir)
    print()
    print(benchmark_report.markdown_report(report))
    print(f'Wrote {paths["json"]}, {paths["md"]} and {paths["png"]}.')
    print(f'The training rows as runs of TensorBoard\'s HParams tab, beside your own: '
          f'tensorboard --logdir={paths["hparams"]}')


def main(argv):
    return onu_cli.run_script(run, argv)


if __name__ == '__main__':
    app.run(main)
