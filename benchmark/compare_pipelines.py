"""The input-pipeline rows of this checkout and another one, interleaved on one machine: is a change slower?

    python -m benchmark.compare_pipelines --data_dir=/tmp/onu_data --other=/path/to/other/checkout

onu_benchmark.py's figures move with the machine between runs; this measures only its pipeline rows (as
measure_pipeline times them), alternating the two checkouts round by round in fresh processes, so that both see the
same machine. Records are converted once, by this checkout, into --work_dir. Prints a table of medians.
"""
import json
import os
import statistics
import subprocess
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', '/tmp/onu_data', 'Photos with a train/val split (make_sample_data.py makes some).')
flags.DEFINE_string('other', None, 'The checkout to compare with (a git worktree or clone of another commit).')
flags.DEFINE_string('work_dir', '/tmp/onu_compare_pipelines', 'Where the raw and encoded records are made.')
flags.DEFINE_integer('rounds', 3, 'Rounds; each measures every row once per checkout.', lower_bound=1)
flags.DEFINE_integer('batches', 20, 'Timed batches per measurement.', lower_bound=1)
flags.DEFINE_integer('warmup_batches', 5, 'Untimed batches after one epoch (the decoded-epoch cache filled).',
                     lower_bound=0)

WAYS = ('images', 'raw', 'encoded')
BATCH_SIZE, IMAGE_SIZE = 32, 299

# Run in the checkout measured, with its own modules: the data description is onu_dataset.describe there, or
# onu_input.dataset_info in checkouts from before issue 29.
_MEASURE = """
import json, math, sys
from onu_lib import onu_cli
from benchmark import measure
import onu_input
data_dir, records_dir, batches, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def train_info(way):
    folder = data_dir if way == 'images' else records_dir
    try:
        from onu_lib import onu_dataset
        return onu_dataset.describe(folder).split('train', way)
    except (ImportError, AttributeError):
        return onu_input.dataset_info(folder, way, 'train')
results = {}
for way in %r:
    info = train_info(way)
    epoch = math.ceil(info.num_examples / %d)
    for stage, augment in (('eval', False), ('train', True)):
        results[f'{way} {stage}'] = measure.measure_pipeline(info, %d, %d, augment, warmup + epoch, batches)
print('RESULTS ' + json.dumps(results))
""" % (WAYS, BATCH_SIZE, BATCH_SIZE, IMAGE_SIZE)


def convert_records(data_dir, records_dir):
    """Converts the photos to raw and encoded records in records_dir with this checkout's converter (once)."""
    if not os.listdir(records_dir):
        subprocess.run([sys.executable, 'convert_to_tfrecord.py', f'--data_dir={data_dir}',
                        f'--output_dir={records_dir}', '--format=both'], check=True, cwd=_HERE)


def measure_checkout(checkout, data_dir, records_dir):
    """Returns {row: {'images_per_sec', 'cores_busy'}} measured by checkout's code in a fresh process."""
    done = subprocess.run([sys.executable, '-c', _MEASURE, data_dir, records_dir, str(FLAGS.batches),
                           str(FLAGS.warmup_batches)], cwd=checkout, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith('RESULTS ')]
    if done.returncode or not lines:
        raise SystemExit(f'error: measuring {checkout} failed:\n{done.stderr[-3000:]}')
    return json.loads(lines[-1][len('RESULTS '):])


def main(argv):
    del argv
    if not FLAGS.other:
        raise app.UsageError('--other is required: the checkout to compare with')
    records_dir = os.path.join(FLAGS.work_dir, 'records')
    os.makedirs(records_dir, exist_ok=True)
    convert_records(os.path.abspath(FLAGS.data_dir), records_dir)
    checkouts = {'this': _HERE, 'other': os.path.abspath(FLAGS.other)}
    rates = {name: {} for name in checkouts}
    for number in range(FLAGS.rounds):
        for name in (('this', 'other') if number % 2 == 0 else ('other', 'this')):  # neither always goes first
            measured = measure_checkout(checkouts[name], FLAGS.data_dir, records_dir)
            for row, result in measured.items():
                rates[name].setdefault(row, []).append(result['images_per_sec'])
            print(f'round {number + 1}/{FLAGS.rounds}, {name}: ' + ', '.join(
                f'{row} {result["images_per_sec"]:.0f}' for row, result in measured.items()), flush=True)
    print(f'\nimages/sec, medians of {FLAGS.rounds} (batch {BATCH_SIZE} at {IMAGE_SIZE}); this: {_HERE}, '
          f'other: {checkouts["other"]}\n')
    print('| row | this | other | this / other |\n| --- | --- | --- | --- |')
    for row in rates['this']:
        this, other = statistics.median(rates['this'][row]), statistics.median(rates['other'][row])
        print(f'| {row} | {this:.1f} | {other:.1f} | {this / other:.3f} |')


_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == '__main__':
    app.run(main)
