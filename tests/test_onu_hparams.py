"""Tests of onu_hparams: real training runs and evaluations under one logdir, read back through a real TensorBoard's
HParams plugin (its HTTP API)."""
import dataclasses
import json
import os
import shutil
import time

import pytest
import tensorflow as tf
from tensorboard.plugins.hparams import metadata as hparams_metadata

from conftest import run_script, session_events
from test_onu_flags import EVERY_TRAINING_FLAG

from onu_lib import onu_hparams
from onu_lib import onu_run_config
from onu_lib import onu_sample_data
import onu_model

ALL_STATUSES = ['STATUS_UNKNOWN', 'STATUS_SUCCESS', 'STATUS_FAILURE', 'STATUS_RUNNING']
TRAIN_FLAGS = ('--model=small', '--image_size=32', '--batch_size=4', '--seed=0', '--log_frequency=2')
RUNS = {'images_input': ('--data_format=images', '--augment_on=input'),
        'encoded_model': ('--data_format=encoded', '--augment_on=model')}


# A benchmark row (onu_benchmark.py writes one per training row), beside the runs.
MEASURED_ROW = 'encoded_on_model-small'
MEASURED_SETTINGS = {'model': 'small', 'image_size': 32, 'batch_size': 4, 'data_format': 'encoded',
                     'augment_on': 'model'}
MEASURED_METRICS = {onu_hparams.EXAMPLES_PER_SEC_TAG: 123.5, onu_hparams.WAIT_FRACTION_TAG: 0.25}


@pytest.fixture(scope='module')
def two_runs(tmp_path_factory):
    """Two 4-step runs of the small model under one logdir, differing in --data_format and --augment_on, each evaluated
    once into RUN/eval, and a benchmark row (MEASURED_ROW). Returns (logdir, {run name: results.jsonl record})."""
    logdir = tmp_path_factory.mktemp('logdir')
    data_dir = str(tmp_path_factory.mktemp('data'))
    onu_sample_data.generate_dataset(data_dir, 8, 4, (96, 72), seed=0, processes=1)
    results = {}
    for name, flags in RUNS.items():
        train_dir = str(logdir / name)
        trained = run_script('onu_train.py', f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=4',
                             *TRAIN_FLAGS, *flags)
        assert trained.returncode == 0, trained.stderr[-3000:]
        evaluated = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={train_dir}/eval',
                               '--run_once')
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        with open(os.path.join(train_dir, 'eval', 'results.jsonl'), encoding='utf-8') as f:
            results[name] = json.loads(f.readline())
        assert f'step 4, precision @ 1 = {results[name]["precision_at_1"]:.3f} ' in evaluated.stdout
        assert 'HParams tab' not in evaluated.stdout  # RUN/eval: the figures join the run's row
    onu_hparams.write_measured_session(str(logdir / MEASURED_ROW), MEASURED_SETTINGS, MEASURED_METRICS)
    return str(logdir), results


def session_groups(server):
    """The HParams plugin's rows: {run name: (hparams, {(group, tag): value}, status)}."""
    answer = server.post_json('/data/plugin/hparams/session_groups', {
        'experimentName': '', 'allowedStatuses': ALL_STATUSES, 'colParams': [], 'startIndex': 0, 'sliceSize': 100})
    rows = {}
    for group in answer['sessionGroups']:
        (session,) = group['sessions']
        metrics = {(value['name']['group'], value['name']['tag']): value['value'] for value in session['metricValues']}
        rows[session['name']] = (group['hparams'], metrics, session['status'])
    return rows


@pytest.mark.script
def test_two_runs_show_as_two_rows_with_their_settings_and_the_precision_eval_printed(two_runs, tensorboard_server,
                                                                                      chromium_page, tmp_path):
    logdir, results = two_runs
    server = tensorboard_server(logdir=logdir)
    for name in RUNS:  # TensorBoard loads run by run: every run's scalars, before its rows are read
        server.wait_for_tags('scalars', name, [onu_hparams.EXAMPLES_PER_SEC_TAG])
        server.wait_for_tags('scalars', f'{name}/eval', [onu_hparams.PRECISION_TAG, onu_hparams.LOSS_TAG])
    server.wait_for_tags('scalars', MEASURED_ROW, list(MEASURED_METRICS))
    experiment = server.post_json('/data/plugin/hparams/experiment', {'experimentName': ''})
    declared = {info['name']: info for info in experiment['hparamInfos']}
    assert sorted(declared) == sorted(setting.name for setting in onu_hparams.SETTINGS)
    assert sorted(declared['data_format']['domainDiscrete']) == ['encoded', 'images', 'raw']  # all, not those seen

    rows = session_groups(server)
    assert sorted(rows) == sorted([*RUNS, MEASURED_ROW])
    # As the dashboard's table shows a number (JavaScript's toPrecision(5)): each row's training examples/sec.
    shown_speeds = ['%#.5g' % metrics[('', onu_hparams.EXAMPLES_PER_SEC_TAG)] for _, metrics, _ in rows.values()]
    settings, metrics, status = rows.pop(MEASURED_ROW)
    assert (settings, metrics, status) == (onu_hparams.as_shown(MEASURED_SETTINGS), {('', tag): value for tag, value in
                                                               MEASURED_METRICS.items()}, 'STATUS_SUCCESS')
    for name, (settings, metrics, status) in rows.items():
        data_format, augment_on = (flag.split('=')[1] for flag in RUNS[name])
        assert (settings['model'], settings['data_format'], settings['augment_on']) == ('small', data_format,
                                                                                       augment_on)
        assert (settings['image_size'], settings['batch_size'], settings['seed']) == ('32', '4', '0')
        assert metrics[('eval', 'Precision @ 1')] == pytest.approx(results[name]['precision_at_1'], abs=1e-6)
        assert metrics[('eval', 'eval/loss')] == pytest.approx(results[name]['loss'], rel=1e-6)
        assert metrics[('', 'examples/sec')] > 0
        assert status == 'STATUS_SUCCESS'

    # The dashboard itself, as a browser renders it: its table has a line for every row (named by a hash of its
    # settings), with its settings and its speed.
    page = chromium_page(f'{server.url}/#hparams')
    text = page.wait_for_text('Trial ID', 'augment_on', 'data_format', 'training examples/sec', *shown_speeds)
    assert ' input ' in text and ' model ' in text and ' images ' in text and ' encoded ' in text
    assert '32.000' not in text  # the image size, when its column shows, as a whole number
    page.screenshot(tmp_path / 'hparams.png')
    assert (tmp_path / 'hparams.png').read_bytes().startswith(b'\x89PNG')


@pytest.mark.script
def test_a_resumed_run_keeps_its_session_and_ends_it_once_more(two_runs, tmp_path):
    logdir, _ = two_runs
    train_dir = str(tmp_path / 'resumed')
    shutil.copytree(os.path.join(logdir, 'images_input'), train_dir)
    with open(os.path.join(train_dir, 'run_config.json'), encoding='utf-8') as f:
        data_dir = json.load(f)['data_dir']
    resumed = run_script('onu_train.py', f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=6',
                         *TRAIN_FLAGS, *RUNS['images_input'])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = session_events(train_dir)
    assert [kind for kind, _ in events] == ['start', 'end', 'end'] and events[0][1]['data_format'] == 'images'
    assert [status for kind, status in events if kind == 'end'] == ['success', 'success']


def test_a_measured_session_takes_only_the_tables_settings_and_its_training_metrics(tmp_path):
    with pytest.raises(ValueError, match='not a setting or training metric of the HParams table: Precision @ 1, '
                                         'feeding'):
        onu_hparams.write_measured_session(str(tmp_path), {'model': 'small', 'feeding': 'x'},
                                           {onu_hparams.PRECISION_TAG: 1.0})
    assert os.listdir(tmp_path) == []


def test_the_batch_size_setting_is_the_examples_one_step_trains_on(parsed):
    options = parsed('--batch_size=3', '--model=small')
    run_config = onu_run_config.RunConfig(model='small', image_size=32)
    # 4 replicas: 2 towers on each of 2 synchronous workers (the training scripts pass towers x workers).
    settings = onu_hparams.settings(options, run_config, 4)
    assert (settings['batch_size'], settings['replicas']) == (12, 4)
    assert onu_hparams.settings(options, run_config, 1)['batch_size'] == 3


def test_each_setting_is_read_from_its_own_option_or_the_runs_config(parsed):
    options = parsed(*EVERY_TRAINING_FLAG)  # every option its own value, none its default
    run_config = onu_run_config.RunConfig(model='inception_resnet_v2', image_size=48, data_format='images',
                                          layout='class_folders', cache_decoded_epoch='disk',
                                          precision='mixed', compute_dtype='bfloat16')
    assert onu_hparams.settings(options, run_config, 3) == {
        'model': 'inception_resnet_v2', 'image_size': 48, 'data_format': 'images', 'layout': 'class_folders',
        'batch_size': 21, 'replicas': 3, 'learning_rate': 0.03, 'learning_rate_schedule': 'fixed',
        'optimizer': 'adam', 'precision': 'bfloat16', 'xla': True, 'augmentations': 'hue,rotation',
        'augment_on': 'model', 'decoded_epoch_cache': 'disk', 'data_service': True, 'label_smoothing': 0.1,
        'weight_decay': 0.0002, 'seed': '11'}
    # Left to the model, or off: the model's own learning rate and weight decay, and words for what is not there.
    defaults = parsed('--augmentations=', '--seed=-1')
    defaults = dataclasses.replace(defaults, seed=None)  # a run without a seed (the library's default)
    spec = onu_model.model_spec('small')
    settings = onu_hparams.settings(defaults, onu_run_config.RunConfig(model='small', image_size=32), 1)
    assert (settings['learning_rate'], settings['weight_decay']) == (spec.learning_rate, spec.weight_decay)
    assert (settings['augmentations'], settings['seed'], settings['decoded_epoch_cache']) == ('none', 'none', 'off')
    assert (settings['xla'], settings['data_service']) == (False, False)


def test_a_sessions_start_and_end_read_back_with_its_settings_declared_in_the_experiment(
        tmp_path, parsed):
    options = parsed('--batch_size=3', '--model=small')
    run_config = onu_run_config.RunConfig(model='small', image_size=32)
    train_dir = str(tmp_path)
    onu_hparams.write_session_start(train_dir, options, run_config, 2)
    onu_hparams.write_session_end(train_dir, 'failure')
    # Written within one second: the event files' names tie, the events' times do not.
    assert session_events(train_dir) == [('start', onu_hparams.as_shown(onu_hparams.settings(options, run_config, 2))),
                                         ('end', 'failure')]
    declared = hparams_metadata.parse_experiment_plugin_data(
        onu_hparams.experiment_config().value[0].metadata.plugin_data.content)
    assert [hparam.name for hparam in declared.hparam_infos] == [setting.name for setting in onu_hparams.SETTINGS]
    choices = {hparam.name: [value.string_value or value.bool_value for value in hparam.domain_discrete.values]
               for hparam in declared.hparam_infos if hparam.HasField('domain_discrete')}
    assert choices['model'] == list(onu_model.MODEL_NAMES) and choices['xla'] == [False, True]
    assert [(metric.name.group, metric.name.tag) for metric in declared.metric_infos] == [
        (group, tag) for group, tag, _ in onu_hparams.METRICS]
    assert onu_hparams.row_eval_dir(train_dir) == os.path.join(train_dir, 'eval')  # the evaluator's: beside it
    written = _summaries(train_dir)  # each run declares the table (its runs share one), and says when it ran
    assert hparams_metadata.EXPERIMENT_TAG in written
    start = hparams_metadata.parse_session_start_info_plugin_data(written[hparams_metadata.SESSION_START_INFO_TAG])
    end = hparams_metadata.parse_session_end_info_plugin_data(written[hparams_metadata.SESSION_END_INFO_TAG])
    assert abs(start.start_time_secs - time.time()) < 60 and abs(end.end_time_secs - time.time()) < 60


def _summaries(train_dir):
    """{tag: plugin content} of the HParams summaries in train_dir's event files, and {tag: value} of its scalars."""
    found = {}
    for name in os.listdir(train_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(train_dir, name)):
            for value in event.summary.value:
                found[value.tag] = (value.metadata.plugin_data.content if value.HasField('metadata')
                                    else value.simple_value)
    return found


def test_a_measured_session_is_a_finished_row_of_its_settings_and_training_figures(tmp_path):
    onu_hparams.write_measured_session(str(tmp_path), MEASURED_SETTINGS, MEASURED_METRICS)
    assert session_events(str(tmp_path)) == [('start', onu_hparams.as_shown(MEASURED_SETTINGS)), ('end', 'success')]
    written = _summaries(str(tmp_path))
    assert hparams_metadata.EXPERIMENT_TAG in written
    assert {tag: written[tag] for tag in MEASURED_METRICS} == MEASURED_METRICS
