"""The decoded epoch in memory, on local disk, and not cached, side by side (issue 32's figures).

    python -m benchmark.cache_modes --data_dir=/tmp/onu_data            # both parts
    python -m benchmark.cache_modes --part=pipeline --sizes=299,64      # the pipeline alone

pipeline: onu_input's training pipeline alone (batch 32, augmentation in the pipeline), in a fresh process per
data format, size, mode and repeat (benchmark.measure.measure_cache_mode; the modes alternate): the first epoch's
seconds, images/sec and CPU ms per image after the disk cache's first read, peak resident memory; medians of --repeats.

training: onu_train.py once per --cache_decoded_epoch mode (small model, batch 32, the data's default format), each in
fresh train and cache folders, one after the other: examples/sec, the median of its log lines from the third epoch on
(the disk cache is written in the first and read back from the second); the seconds to its first log line past one
epoch (start-up included; the memory cache decodes its whole first epoch before step 1); its CPU seconds per image
over the whole run (the model's share included); its peak resident memory.
Prints Markdown tables, with the machine's CPU. Run it on an otherwise idle machine.
"""
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()

from benchmark import runner as benchmark_runner  # noqa: E402
from onu_lib import onu_dataset  # noqa: E402
from onu_lib import onu_precision  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', '/tmp/onu_data', 'The data trained on (make_sample_data.py makes some).')
flags.DEFINE_enum('part', 'both', ['both', 'pipeline', 'training'], 'What to measure.')
flags.DEFINE_integer('image_size', 299, 'Training image size of the training part.', lower_bound=1)
flags.DEFINE_list('sizes', ['299', '64'], 'Image sizes of the pipeline part.')
flags.DEFINE_list('formats', ['images', 'raw', 'encoded'], 'Data formats of the pipeline part (those the data has).')
flags.DEFINE_integer('batches', 40, 'Timed batches of each pipeline measurement.', lower_bound=1)
flags.DEFINE_integer('repeats', 3, 'Repeats of each pipeline measurement (the modes in turn); tables show medians.',
                     lower_bound=1)
flags.DEFINE_integer('batch_size', 32, 'Batch size.', lower_bound=1)
flags.DEFINE_integer('max_steps', 100, 'Steps per run; make it three epochs or more.', lower_bound=1)
flags.DEFINE_integer('log_frequency', 5, 'Steps between the log lines read.', lower_bound=1)
flags.DEFINE_list('modes', ['memory', 'disk', 'off'], 'The --cache_decoded_epoch modes run, in this order.')
flags.DEFINE_string('work_dir', None, 'Parent of the temporary train and cache folders (on the disk measured); '
                    'default: the system temp folder. Removed at the end.')

LOG_LINE = re.compile(r'^(\S+ \S+): step (\d+), loss = \S+ \(([\d.]+) examples/sec')


def run_mode(mode, work_dir, num_examples):
    """Trains once with --cache_decoded_epoch=mode; returns its figures."""
    train_dir, cache_dir = os.path.join(work_dir, f'train-{mode}'), os.path.join(work_dir, f'cache-{mode}')
    command = [sys.executable, 'onu_train.py', f'--data_dir={FLAGS.data_dir}', f'--train_dir={train_dir}',
               '--model=small', f'--image_size={FLAGS.image_size}', f'--batch_size={FLAGS.batch_size}',
               f'--max_steps={FLAGS.max_steps}', f'--log_frequency={FLAGS.log_frequency}',
               f'--cache_decoded_epoch={mode}', f'--cache_dir={cache_dir}', '--save_checkpoint_secs=0']
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    steps_per_epoch = math.ceil(num_examples / FLAGS.batch_size)
    rates, first_epoch_seconds = [], None
    for line in process.stdout:
        match = LOG_LINE.match(line)
        if not match:
            continue
        step = int(match.group(2))
        if first_epoch_seconds is None and step >= steps_per_epoch:
            first_epoch_seconds = time.time() - started
        if step > 2 * steps_per_epoch + FLAGS.log_frequency:
            rates.append(float(match.group(3)))
    _, status, usage = os.wait4(process.pid, 0)
    if status or not rates:
        raise RuntimeError(f'{" ".join(command)} failed (status {status}) or logged no step past two epochs: '
                           f'raise --max_steps')
    images = FLAGS.max_steps * FLAGS.batch_size
    return {'examples_per_sec': statistics.median(rates), 'first_epoch_seconds': first_epoch_seconds,
            'cpu_ms_per_image': 1000 * (usage.ru_utime + usage.ru_stime) / images,
            'peak_rss_mb': usage.ru_maxrss / 1024, 'cache_mb': benchmark_runner.folder_bytes(cache_dir) / 2**20}


def pipeline_part(work_dir):
    """Measures the pipeline per format, size and mode; prints its table."""
    data = onu_dataset.describe(FLAGS.data_dir)
    log = os.path.join(work_dir, 'pipeline.log')
    rows = []
    for data_format in [name for name in FLAGS.formats if name == 'images' or data.has_records(name)]:
        for size in [int(size) for size in FLAGS.sizes]:
            runs = {mode: [] for mode in FLAGS.modes}
            for repeat in range(FLAGS.repeats):
                for mode in FLAGS.modes:
                    cache_root = os.path.join(work_dir, f'pipeline-{data_format}-{size}-{repeat}')
                    with benchmark_runner.FreshPython('benchmark.measure', log) as fresh:
                        runs[mode].append(fresh.call(
                            'measure_cache_mode', data_dir=FLAGS.data_dir, data_format=data_format,
                            batch_size=FLAGS.batch_size, image_size=size, mode=mode, batches=FLAGS.batches,
                            cache_root=cache_root))
                    shutil.rmtree(cache_root, ignore_errors=True)
            results = {mode: {name: statistics.median(run[name] for run in mode_runs) for name in mode_runs[0]}
                       for mode, mode_runs in runs.items()}
            rows.append((data_format, size, results))
    print(f'\nThe training pipeline alone, batch {FLAGS.batch_size}, augmentation in the pipeline, '
          f'{FLAGS.batches} batches timed after two epochs, medians of {FLAGS.repeats}; {_machine()}\n')
    print('| format | size | --cache_decoded_epoch | img/s | CPU ms per image | first epoch, s | peak RSS, MB |')
    print('| --- | --- | --- | --- | --- | --- | --- |')
    for data_format, size, results in rows:
        for mode, result in results.items():
            print(f'| {data_format} | {size} | {mode} | {result["images_per_sec"]:.0f} | '
                  f'{result["cpu_ms_per_image"]:.2f} | {result["first_epoch_seconds"]:.1f} | '
                  f'{result["peak_rss_mb"]:.0f} |')
    print()
    for data_format, size, results in rows:
        if {'memory', 'disk', 'off'} <= set(results):
            memory, disk, off = results['memory'], results['disk'], results['off']
            print(f'- {data_format} at {size} (one decoded epoch: {disk["epoch_mb"]:.0f} MB): CPU ms per image, disk / '
                  f'memory {disk["cpu_ms_per_image"] / memory["cpu_ms_per_image"]:.2f}, off / disk '
                  f'{off["cpu_ms_per_image"] / disk["cpu_ms_per_image"]:.2f}; img/s disk / off '
                  f'{disk["images_per_sec"] / off["images_per_sec"]:.2f}; first epoch disk / off '
                  f'{disk["first_epoch_seconds"] / off["first_epoch_seconds"]:.2f}; peak RSS disk - off '
                  f'{(disk["peak_rss_mb"] - off["peak_rss_mb"]) / disk["epoch_mb"]:.2f} and memory - off '
                  f'{(memory["peak_rss_mb"] - off["peak_rss_mb"]) / disk["epoch_mb"]:.2f} of one decoded epoch')


def _machine():
    """The CPU and core count measured on."""
    return f'{onu_precision.read_cpu_info()[0]}, {os.cpu_count()} cores'


def training_part(work_dir):
    """Trains once per mode; prints its table."""
    data = onu_dataset.describe(FLAGS.data_dir)
    info = data.split('train', data.default_format())
    epoch_mb = info.num_examples * FLAGS.image_size ** 2 * 3 / 2**20
    results = {mode: run_mode(mode, work_dir, info.num_examples) for mode in FLAGS.modes}
    print(f'\nsmall model, batch {FLAGS.batch_size}, {FLAGS.image_size}x{FLAGS.image_size}, {info.num_examples} '
          f'{info.data_format} training examples (one decoded epoch: {epoch_mb:.0f} MB), {FLAGS.max_steps} steps; '
          f'{_machine()}\n')
    print('| --cache_decoded_epoch | examples/sec from epoch 3 | first epoch, s (start-up included) | '
          'CPU ms per image | peak RSS, MB | cache on disk, MB |')
    print('| --- | --- | --- | --- | --- | --- |')
    for mode, result in results.items():
        print(f'| {mode} | {result["examples_per_sec"]:.1f} | {result["first_epoch_seconds"]:.1f} | '
              f'{result["cpu_ms_per_image"]:.1f} | {result["peak_rss_mb"]:.0f} | {result["cache_mb"]:.0f} |')
    if {'memory', 'disk', 'off'} <= set(results):
        memory, disk, off = results['memory'], results['disk'], results['off']
        print(f'\ndisk / memory examples/sec: {disk["examples_per_sec"] / memory["examples_per_sec"]:.2f}; '
              f'disk / off: {disk["examples_per_sec"] / off["examples_per_sec"]:.2f}; first epoch disk / off: '
              f'{disk["first_epoch_seconds"] / off["first_epoch_seconds"]:.2f}; peak RSS disk - off: '
              f'{(disk["peak_rss_mb"] - off["peak_rss_mb"]) / epoch_mb:.2f} of one decoded epoch')


def main(argv):
    del argv
    if FLAGS.work_dir:
        os.makedirs(FLAGS.work_dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix='onu_cache_modes-', dir=FLAGS.work_dir)
    try:
        if FLAGS.part in ('both', 'pipeline'):
            pipeline_part(work_dir)
        if FLAGS.part in ('both', 'training'):
            training_part(work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == '__main__':
    app.run(main)
