"""Tests of onu_tensorboard.py: TensorBoard started as README says, with no start-up noise, serving a run."""
import json
import subprocess
import sys
import time
import urllib.request

from conftest import REPO_ROOT, TENSORBOARD_SERVING_LINE, TENSORBOARD_TIMEOUT_SECS

from onu_lib import onu_cli
import onu_tensorboard

# What `tensorboard --logdir` prints at every start besides TensorFlow's native lines (onu_cli.NATIVE_START_UP_LINE).
FAST_LOADING_NOTE = 'Using experimental fast data loading logic'


def test_the_classic_loader_is_chosen_unless_the_command_chooses_one():
    assert onu_tensorboard.tensorboard_arguments(['x', '--logdir', 'd']) == ['x', '--logdir', 'd', '--load_fast=false']
    assert onu_tensorboard.tensorboard_arguments(['x', '--load_fast=true']) == ['x', '--load_fast=true']
    assert onu_tensorboard.tensorboard_arguments(['x', '--verbose', '--load_fast=auto']) == ['x', '--load_fast=auto']


def test_it_starts_without_noise_lines_and_serves_the_run(tiny_run, tmp_path):
    log_path = tmp_path / 'tensorboard.log'
    with open(log_path, 'wb') as log:
        server = subprocess.Popen([sys.executable, 'onu_tensorboard.py', '--logdir', tiny_run.train_dir,
                                   '--host', '127.0.0.1', '--port', '0'], cwd=REPO_ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + TENSORBOARD_TIMEOUT_SECS
        while not TENSORBOARD_SERVING_LINE.search(log_path.read_text()):
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        lines = log_path.read_text().splitlines()
        url = TENSORBOARD_SERVING_LINE.search(lines[-1]).group(1)
        noise = [line for line in lines if onu_cli.NATIVE_START_UP_LINE.match(line) or FAST_LOADING_NOTE in line]
        assert noise == [] and not [line for line in lines if line.startswith('NOTE')], lines
        with urllib.request.urlopen(f'{url}/data/plugin/scalars/tags', timeout=30) as answer:
            tags = json.load(answer)
        assert 'losses/total' in tags['.'], tags
    finally:
        server.terminate()
        server.wait(timeout=30)
