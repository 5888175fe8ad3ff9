"""Tests of training on TensorFlow's tf.data service (onu_data_service.py, run_data_service.py, the service path of
onu_input.service_batches): real dispatcher and worker processes on 127.0.0.1, started here on free ports."""
import collections
import hashlib
import json
import os
import re
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import finish, layout_photos, ProcessOutput, run_script, start_script
from test_onu_input import _write_jpeg_with_bad_scan

from onu_lib import onu_data_service
from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_launch
import onu_input

STEPS = 12
TRAIN_FLAGS = ('--model=small', '--image_size=32', '--batch_size=8', '--seed=1', '--log_frequency=2',
               '--save_checkpoint_steps=6', f'--max_steps={STEPS}')
START_TIMEOUT_SECS = 180


class Service:
    """A run_data_service.py process: its address, its output lines so far (a thread reads them), its workers' pids."""

    def __init__(self, work_dir, num_workers):
        self.port = onu_launch.free_ports('127.0.0.1', 1)[0]
        self.address = f'grpc://127.0.0.1:{self.port}'
        self.process = start_script('run_data_service.py', f'--num_workers={num_workers}', f'--port={self.port}',
                                    f'--work_dir={work_dir}', stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = ProcessOutput(self.process)
        self.wait_for('tf.data service ready', START_TIMEOUT_SECS)

    def wait_for(self, text, timeout_secs):
        """Returns the first line of output that holds text, once printed."""
        return self.output.wait_for(f'[^\n]*{re.escape(text)}[^\n]*\n', timeout_secs).group(0)

    def worker_pids(self):
        """Returns {worker name: pid} from the 'started worker N (pid P)' lines."""
        return {line.split(' (pid')[0][len('started '):]: int(line.split('(pid ')[1].split(')')[0])
                for line in self.output.text.splitlines() if line.startswith('started worker')}

    def stop(self):
        """Stops the service with SIGTERM as a user would; returns its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture(scope='module')
def service(tmp_path_factory):
    """A tf.data service of two workers on this machine, shared by this module's tests (the last one kills one)."""
    running = Service(str(tmp_path_factory.mktemp('service') / 'work'), num_workers=2)
    yield running
    running.stop()
    assert not any(pid_alive(pid) for pid in running.worker_pids().values()), running.output.text


def pid_alive(pid):
    """Whether a process with this pid still runs (and is not a zombie)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[1][0] != 'Z'
    except OSError:
        return False


def photo_folder(folder, photos_per_class=12):
    """Writes class folders of distinct photos (no split) under folder; returns it."""
    for photo in layout_photos(train=photos_per_class, val=0):
        path = os.path.join(folder, photo.name.split('_')[0], photo.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as f:
            f.write(photo.data)
    return folder


# ----------------------------------------------------------------------------------------------

def test_an_address_is_grpc_host_port():
    assert onu_data_service.service_address('localhost:5050') == 'grpc://localhost:5050'
    assert onu_data_service.service_address(' grpc://10.0.0.7:6000 ') == 'grpc://10.0.0.7:6000'
    for bad in ('localhost', 'grpc://host', 'http://host:5050', 'host:0', 'host:70000', 'host:50:50'):
        with pytest.raises(onu_data_service.ServiceError, match='grpc://HOST:PORT'):
            onu_data_service.service_address(bad)


def test_augmented_images_cross_the_network_as_uint8_within_half_a_grey_level():
    augmented = np.random.default_rng(0).uniform(-1.0, 1.0, [4, 8, 8, 3]).astype(np.float32)
    augmented[0, 0, 0] = [-1.0, 1.0, 1.0]  # the ends come back exactly
    sent = onu_input._quantized(tf.constant(augmented))  # pylint: disable=protected-access
    received = onu_input._dequantized(sent).numpy()  # pylint: disable=protected-access
    assert sent.dtype == tf.uint8 and received.dtype == np.float32
    assert np.abs(received - augmented).max() <= 1.0 / 255.0 + 1e-6  # half a grey level of [0, 1], in [-1, 1]
    assert received[0, 0, 0].tolist() == [-1.0, 1.0, 1.0]


def test_an_unreachable_service_or_a_cache_with_it_is_one_line(tmp_path):
    port = onu_launch.free_ports('127.0.0.1', 1)[0]
    result = run_script('onu_train.py', *TRAIN_FLAGS, f'--data_service=grpc://127.0.0.1:{port}',
                        f'--train_dir={tmp_path / "train"}', f'--data_dir={photo_folder(str(tmp_path / "photos"))}')
    assert result.returncode == 2
    assert result.stderr.strip() == (f'error: cannot reach the tf.data service at grpc://127.0.0.1:{port} '
                                     f'(Connection refused): start its dispatcher there (python run_data_service.py '
                                     f'--port={port}) or fix --data_service')
    result = run_script('onu_train.py', '--data_service=grpc://127.0.0.1:5050', '--cache_decoded_epoch=disk',
                        f'--train_dir={tmp_path / "train"}')
    assert result.returncode == 1 and ('--cache_decoded_epoch=memory or disk keeps the decoded epoch on this machine'
                                       in result.stderr)
    assert 'Traceback' not in result.stderr and not os.path.exists(tmp_path / 'train' / 'run_config.json')


def test_the_dispatcher_lists_the_workers_that_registered(service):
    workers = onu_data_service.check_reachable(service.address)
    assert len(workers) == 2 and all(onu_launch.answers(worker) for worker in workers)


@pytest.mark.parametrize('data_format, script, extra', [
    ('encoded', 'onu_train.py', ()),
    ('raw', 'onu_train.py', ('--augment_on=model',)),
    ('images', 'onu_multi_gpu_train.py', ('--num_gpus=2',)),
])
def test_a_run_reads_its_batches_from_the_service_and_its_checkpoints_evaluate(service, tmp_path, pattern_image,
                                                                              data_format, script, extra):
    data_dir = photo_folder(str(tmp_path / 'photos'))
    hidden = next(name for name in (f'rose/._{index}.jpg' for index in range(100))
                  if onu_dataset.split_of(name, 10) == 'train')
    with open(os.path.join(data_dir, hidden), 'wb') as f:  # macOS's resource fork of a photo: counted, not read
        f.write(bytes(40))
    train_dir = str(tmp_path / 'train')
    result = run_script(script, *TRAIN_FLAGS, *extra, f'--data_format={data_format}', f'--data_dir={data_dir}',
                        f'--train_dir={train_dir}', f'--data_service={service.address}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert f'Input from the tf.data service at {service.address}: 2 worker(s) registered' in result.stdout
    assert f'Training stopped at step {STEPS}' in result.stdout
    with open(os.path.join(train_dir, 'run_config.json')) as f:
        assert json.load(f)['cache_decoded_epoch'] == 'off'
    # Said by the trainer's listing of the train photos, or by its conversion of them all into records.
    splits = ('train',) if data_format == 'images' else onu_dataset.SPLITS
    looked_at = 1 + sum(onu_dataset.describe(data_dir).split(split, 'images').num_examples for split in splits)
    skipped = [line for line in result.stdout.splitlines() if line.startswith('skipped ')]
    assert skipped == [f'skipped 1 of {looked_at} files: 1 hidden or system file; the list: '
                       + skipped[0].split('; the list: ')[-1]] and 'Traceback' not in result.stderr
    if data_format != 'encoded':  # one evaluation shows the checkpoints are as usual
        return
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={tmp_path / "eval"}',
                           '--run_once')
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    with open(tmp_path / 'eval' / 'results.jsonl') as f:
        result = json.loads(f.readline())
    held_out = onu_dataset.describe(data_dir).split('val', 'images').num_examples
    assert result['step'] == STEPS and result['num_examples'] == held_out >= 1  # eval reads val locally, each once


def test_a_finite_epoch_through_two_workers_holds_every_photo_once(service, tmp_path):
    data_dir = photo_folder(str(tmp_path / 'photos'), 6)
    info = onu_dataset.describe(data_dir, validation_percent=0).split('train', 'images')
    assert info.num_examples == 18
    with tf.Graph().as_default():  # one epoch, in batches of one (a worker's last partial batch would be dropped)
        dataset = onu_input.service_batches(info, 1, 32, onu_input.ServiceJob(service.address, num_epochs=1), seed=3)
        images = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()[0]
        seen = []
        with tf.compat.v1.Session() as session:
            while True:
                try:
                    seen.append(hashlib.sha1(session.run(images).tobytes()).hexdigest())
                except tf.errors.OutOfRangeError:
                    break
    # The dispatcher hands each unit of photos to one of the two workers: every photo once. Each worker reading
    # every photo (processing mode parallel_epochs, no sharding) would give each twice.
    counts = collections.Counter(seen)
    assert len(counts) == 18 and set(counts.values()) == {1}, counts


def test_a_photo_a_worker_cannot_decode_stops_the_trainer_with_one_line_naming_it(service, tmp_path, pattern_image):
    data_dir = photo_folder(str(tmp_path / 'photos'), 2)
    bad = os.path.join(data_dir, 'rose', 'bad_scan.jpg')
    _write_jpeg_with_bad_scan(bad, pattern_image)  # its header is fine: only a worker's decoding finds the problem
    info = onu_dataset.describe(data_dir, validation_percent=0).split('train', 'images')
    with tf.Graph().as_default():
        dataset = onu_input.service_batches(info, 1, 32, onu_input.ServiceJob(service.address, num_epochs=1), seed=3,
                                            augment=onu_input.AugmentOptions.default())
        images = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()[0]
        with pytest.raises(onu_errors.DataError) as error:
            with onu_dataset.read_errors_as_data_error(info), tf.compat.v1.Session() as session:
                for _ in range(info.num_examples):  # the epoch: never without it, nor a silent gap
                    session.run(images)
    message = str(error.value)
    assert message.startswith(f'{bad}: cannot be decoded (') and message.endswith('fix or remove it, then start again')


def test_a_killed_worker_leaves_training_going_with_one_warning(service, tmp_path):
    train_dir = str(tmp_path / 'train')
    trainer = start_script('onu_train.py', *TRAIN_FLAGS[:-1], '--max_steps=150', '--data_format=encoded',
                           f'--data_dir={photo_folder(str(tmp_path / "photos"))}', f'--train_dir={train_dir}',
                           f'--data_service={service.address}', stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout_lines = []
    for line in trainer.stdout:  # until training runs
        stdout_lines.append(line)
        if ', loss = ' in line:
            break
    name, pid = sorted(service.worker_pids().items())[0]
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = finish(trainer, 300)
    stdout = ''.join(stdout_lines) + stdout
    assert trainer.returncode == 0, stderr[-3000:]
    assert 'Training stopped at step 150' in stdout
    warnings = [line for line in stderr.splitlines() if 'stopped answering' in line]
    assert len(warnings) == 1 and 'training goes on with the other 1 worker(s)' in warnings[0], stderr[-3000:]
    assert service.wait_for(f'{name} (pid {pid}) exited with status -9; 1 worker(s) still serving', 30)
    steps = [int(line.split('step ')[1].split(',')[0]) for line in stdout.splitlines() if ', loss = ' in line]
    assert steps == list(range(2, 151, 2)) and np.isfinite(
        [float(line.split('loss = ')[1].split(' ')[0]) for line in stdout.splitlines() if ', loss = ' in line]).all()
