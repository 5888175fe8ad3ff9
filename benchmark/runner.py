"""How onu_benchmark.py runs its measurements: in order with progress and the CPU time others took meanwhile, in
fresh processes, on the photos measured and a known machine."""
import collections
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import tensorflow as tf

from onu_lib import onu_dataset
from onu_lib import onu_pool
from onu_lib import onu_precision
from onu_lib import onu_training

RESULT_MARKER = 'onu_benchmark result: '
BUSY_MACHINE_CORES = 0.2  # other processes using more than this during a measurement disturb it

_SERVER_CODE = f"""
import importlib, json, os, sys
cpu = json.loads(sys.argv[2])
if cpu is not None:
    os.sched_setaffinity(0, {{cpu}})  # before any thread starts, so that every thread inherits it
from onu_lib import onu_cli  # first, as in every script: a quiet and quick start
onu_cli.import_tensorflow()
module = importlib.import_module(sys.argv[1])
for line in sys.stdin:
    name, kwargs = json.loads(line)
    print({RESULT_MARKER!r} + json.dumps(getattr(module, name)(**kwargs)), flush=True)
"""


# ----------------------------------------------------------------------------------------------
# Fresh processes.

class FreshPython:
    """A new Python process that imports module_name once, then runs its functions on request.

    Its worker processes (the converter's) start as a user's script's would, not from the benchmark's imports.
    cpu: pin the whole process to that one CPU."""

    def __init__(self, module_name, log_path, cpu=None):
        self._module_name = module_name
        self._log_path = log_path
        self._cpu = cpu
        self._log = None
        self._process = None

    def _start(self):
        """Starts the process (at the first call, so that its imports disturb no earlier measurement)."""
        self._log = open(self._log_path, 'w', encoding='utf-8')  # a file, not a pipe: a full pipe would block it
        self._process = subprocess.Popen(
            [sys.executable, '-c', _SERVER_CODE, self._module_name, json.dumps(self._cpu)],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the repository: its modules import
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)

    def call(self, function_name, **kwargs):
        """Returns <module>.<function_name>(**kwargs) computed in the process."""
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


# ----------------------------------------------------------------------------------------------
# Running the measurements with a progress display and CPU accounting.

@dataclasses.dataclass
class Task:
    """One measurement: results of tasks with the same key are repeats of each other."""
    key: tuple
    label: str
    run: object       # () -> dict
    describe: object  # dict -> short text
    estimate: float   # seconds, used until a task with the same key has run


REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_repo_script(script, *args):
    """Runs a script of the repo in a process of its own; returns its stdout; exits with its stderr if it fails."""
    done = subprocess.run([sys.executable, os.path.join(REPO_DIR, script), *args], cwd=REPO_DIR,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f'{script} {" ".join(args)} failed:\n{done.stderr[-3000:]}')
    return done.stdout


def format_duration(seconds):
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

    Returns {key: [result of each repeat]}; each result also holds other_processes_cores, the cores processes
    outside this benchmark kept busy meanwhile."""
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
        print(f'{prefix}: {task.describe(result)}  ({format_duration(seconds)}; '
              f'{format_duration(time.time() - started)} elapsed, ~{format_duration(left)} left{warning})',
              flush=True)
    return results


def other_processes_summary(results):
    """Returns how busy processes outside the benchmark kept the machine during the measurements."""
    measured = [result for repeats in results.values() for result in repeats]
    seconds = sum(result['task_seconds'] for result in measured)
    return {'mean_cores': sum(r['other_processes_cores'] * r['task_seconds'] for r in measured) / seconds,
            'max_cores': max(r['other_processes_cores'] for r in measured),
            'disturbed_measurements': sum(r['other_processes_cores'] > BUSY_MACHINE_CORES for r in measured),
            'measurements': len(measured)}


# ----------------------------------------------------------------------------------------------
# The photos measured, and the machine.

def prepare_photos(data_dir, work_dir, max_images_per_class, validation_percent):
    """Returns the photo folder to measure: data_dir (with the sample data if it is the default and empty, as in
    training), or a copy in split folders of its first photos per class, bare class folders split as training does."""
    data, _ = onu_training.prepare_data(data_dir, 'images', validation_percent, None)
    class_names = data.photo_class_names()
    if not max_images_per_class and data.layout == onu_dataset.PHOTOS:
        return data_dir
    # A subset, or bare class folders: copied into train/ and val/ folders, which the baselines read.
    subset_dir = os.path.join(work_dir, 'photos')
    for split in data.photo_splits():
        per_class = collections.Counter()
        for image in onu_dataset.list_split_images(data_dir, split, class_names, validation_percent)[0]:
            if not max_images_per_class or per_class[image.label] < max_images_per_class:
                per_class[image.label] += 1
                target_dir = os.path.join(subset_dir, split, image.class_name)
                os.makedirs(target_dir, exist_ok=True)
                shutil.copy2(image.path, target_dir)
    return subset_dir


def photo_paths(data_dir):
    """Returns the usable photos of every split of data_dir."""
    data = onu_dataset.describe(data_dir)
    class_names = data.photo_class_names()
    return [image.path for split in data.photo_splits()
            for image in onu_dataset.list_split_images(data_dir, split, class_names)[0]]


def folder_bytes(folder):
    """Returns the bytes of every file below folder (0 if there is none)."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def hardware_info():
    """Returns the CPU model, core counts, GPUs and versions this run measured on."""
    cpu_model = onu_precision.read_cpu_info()[0] or platform.processor() or platform.machine()
    gpus = [tf.config.experimental.get_device_details(gpu).get('device_name', gpu.name)
            for gpu in onu_precision.visible_gpus()]
    return {'cpu_model': cpu_model, 'cpu_count': os.cpu_count(), 'usable_cores': onu_pool.worker_count(),
            'gpus': gpus, 'memory_gib': round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1),
            'tensorflow': tf.__version__, 'python': platform.python_version(), 'platform': platform.platform()}
