"""Tests of onu_lib/onu_flags.py and onu_lib/onu_settings.py: each setting declared once, as a field that declares its
flag; the training flags read once into one onu_training.TrainingOptions."""

import dataclasses

from absl import flags
import pytest

import onu_input
from onu_lib import onu_cli
from onu_lib import onu_dataset
from onu_lib import onu_flags
from onu_lib import onu_precision
from onu_lib import onu_run_config
from onu_lib import onu_settings
from onu_lib import onu_training

FLAGS = flags.FLAGS
onu_flags.define_training_flags()


def test_every_training_option_is_read_from_its_flag(parsed):
    options = parsed('--train_dir=/tmp/t', '--data_dir=/tmp/d', '--batch_size=7', '--max_steps=9',
                     '--augmentations=hue,rotation', '--cache_decoded_epoch=off', '--profile_steps=3,5',
                     '--checkpoint_exclude_scopes=A/Logits,B', '--save_checkpoint_secs=0', '--labels_offset=1')
    assert isinstance(options, onu_training.TrainingOptions)
    assert (options.train_dir, options.data_dir, options.batch_size, options.max_steps) == ('/tmp/t', '/tmp/d', 7, 9)
    assert options.augmentations == onu_input.AugmentOptions({'hue', 'rotation'})
    assert options.cache_decoded_epoch == 'off' and options.profile_steps == (3, 5)
    assert options.checkpoint_exclude_scopes == ('A/Logits', 'B') and options.save_checkpoint_secs == 0
    assert options.labels_offset == 1
    assert options.flag_values['batch_size'] == 7 and options.flag_values['train_dir'] == '/tmp/t'
    # Every field but the recorded flag values is a flag of the same name (one name for one thing).
    fields = {field.name for field in dataclasses.fields(onu_training.TrainingOptions)} - {'flag_values'}
    assert fields <= set(FLAGS), fields - set(FLAGS)


def test_defaults_leave_the_model_and_data_to_decide(parsed):
    options = parsed()
    assert options.model is None and options.image_size is None and options.learning_rate is None
    assert options.cache_decoded_epoch == 'auto' and options.cache_dir is None and options.profile_steps is None
    assert options.augmentations == onu_input.AugmentOptions.default() == onu_input.AugmentOptions.of(True)
    # README "Changed defaults": every script's data in /tmp/onu_data (where make_sample_data.py writes), seed 0.
    assert (options.data_dir, options.seed) == ('/tmp/onu_data', 0)


@pytest.mark.parametrize('model_flag, model, image_size', [(None, 'small', 64), ('inception_resnet_v2', None, 299),
                                                           ('small', None, 64)])
def test_the_model_and_its_image_size_default_to_the_models_own(parsed, tiny_data_dir, model_flag, model, image_size):
    """README: --model is small without a GPU; --image_size defaults to the model's own (299 or 64)."""
    options = parsed(f'--data_dir={tiny_data_dir}', *([f'--model={model_flag}'] if model_flag else []))
    data = onu_dataset.describe(tiny_data_dir)
    run_config = onu_training.training_run_config(options, onu_precision.Precision('float32'), data,
                                                  data.split('train', 'encoded'))
    assert (run_config.model, run_config.image_size) == (model or model_flag, image_size)
    assert run_config.flags['image_size'] is None  # chosen, not given


# Every training flag given a value of its own, none its default (and no two numbers alike): an option read from
# another flag, or left at its default, shows.
EVERY_TRAINING_FLAG = (
    '--train_dir=/tmp/t', '--data_dir=/tmp/d', '--data_format=raw', '--validation_percent=15', '--labels_offset=1',
    '--model=small', '--image_size=40', '--batch_size=7', '--max_steps=9', '--precision=float32', '--xla',
    '--seed=11', '--augmentations=hue,rotation', '--augment_on=model', '--cache_decoded_epoch=off',
    '--cache_dir=/tmp/c', '--reduced_decode', '--optimizer=adam', '--learning_rate=0.03',
    '--learning_rate_schedule=fixed', '--num_epochs_per_decay=3.5', '--learning_rate_decay_factor=0.5',
    '--moving_average_decay=0.99', '--weight_decay=0.0002', '--label_smoothing=0.1', '--trainable_scopes=A,B',
    '--fine_tune_checkpoint=/tmp/f', '--checkpoint_exclude_scopes=A/Logits,C', '--log_frequency=3',
    '--save_checkpoint_secs=13', '--save_checkpoint_steps=17', '--keep_checkpoint_max=19',
    '--save_summaries_steps=23', '--export_every_n_epochs=2', '--profile_steps=3,5', '--histograms',
    '--ps_hosts=p:1', '--worker_hosts=w:1,w:2', '--job_name=worker', '--task_index=1', '--sync_replicas',
    '--ps_wait_secs=29', '--data_service=localhost:5050')


def test_each_training_option_is_its_own_flags_value(parsed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a script started from another folder
    options = parsed(*EVERY_TRAINING_FLAG)
    read = {'augmentations': onu_input.AugmentOptions({'hue', 'rotation'}), 'profile_steps': (3, 5),
            'data_service': 'grpc://localhost:5050'}  # the options the flags' values are parsed into
    for arg in EVERY_TRAINING_FLAG:
        name = arg[2:].split('=')[0]
        flag = FLAGS[name]
        assert flag.value != flag.default, f'--{name} is not given a value of its own'
        expected = read.get(name, tuple(flag.value) if isinstance(flag.value, list) else flag.value)
        assert getattr(options, name) == expected, name
    # What the run records: the flags by their names, not the deprecated aliases of some.
    assert options.flag_values['max_steps'] == 9 and options.flag_values['ps_wait_secs'] == 29
    assert 'checkpoint_path' not in options.flag_values and options.flag_values['fine_tune_checkpoint'] == '/tmp/f'


def _settings(settings):
    """The fields of the dataclass settings that declare a flag."""
    return [field for field in dataclasses.fields(settings) if onu_settings.flag_of(field)]


def test_each_option_has_the_type_its_field_declares_by_default_and_when_given(parsed):
    """A field and its flag that disagree show here: an integer flag for a float field, a default (None) that the
    field's type does not take."""
    for options in (parsed(), parsed(*EVERY_TRAINING_FLAG)):
        for field in _settings(onu_training.TrainingOptions):
            assert isinstance(getattr(options, field.name), field.type), (field.name, getattr(options, field.name))


def test_the_training_run_records_the_flag_of_each_option_and_no_other_flag(tiny_run):
    """A flag the training scripts declare beside TrainingOptions, or a field that is no flag, shows here: the run's
    run_config.json records the flags the training script declared (onu_cli's --verbose besides)."""
    fields = dataclasses.fields(onu_training.TrainingOptions)
    assert [field.name for field in fields if not onu_settings.flag_of(field)] == ['flag_values']
    assert set(tiny_run.config.flags) - {onu_cli.VERBOSE_FLAG} == {field.name for field in _settings(
        onu_training.TrainingOptions)}


def test_a_value_no_option_can_take_is_refused_and_the_old_cache_spelling_reads_as_the_new(parsed):
    assert parsed('--cache_decoded_epoch=on').cache_decoded_epoch == 'memory'
    assert parsed('--profile_steps=1,2').profile_steps == (1, 2)  # from the first step
    for refused in (['--data_service=localhost'], ['--profile_steps=9,3'],
                    ['--data_service=localhost:5050', '--cache_decoded_epoch=disk'],
                    ['--data_service=localhost:5050', '--cache_decoded_epoch=on']):
        with pytest.raises(flags.IllegalFlagValueError):
            parsed(*refused)
    assert parsed('--data_service=localhost:5050', '--cache_decoded_epoch=auto').data_service


def test_a_flag_given_wins_over_the_training_runs_value_and_the_default_is_used_without_a_run(parsed):
    run_config = onu_run_config.RunConfig(model='small', image_size=48)
    parsed()
    assert onu_flags.value_or_saved('image_size', run_config) == 48
    assert onu_flags.value_or_saved('image_size', None) is None
    parsed('--image_size=40')
    assert onu_flags.value_or_saved('image_size', run_config) == 40
